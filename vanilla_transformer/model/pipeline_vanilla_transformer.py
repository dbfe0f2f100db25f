"""`pipeline("translation", ...)` for vanilla-transformer checkpoints.

transformers 5 removed its built-in translation pipeline; this file brings it back for our models. It is shipped
next to Hub checkpoints (`custom_pipelines` in config.json), so `pipeline("translation", model=repo,
trust_remote_code=True)` works where the package is not installed; it imports only transformers.
"""

from typing import Any

from transformers import Pipeline

# config.json's `custom_pipelines` entry that points `pipeline("translation", ..., trust_remote_code=True)` at the
# class below, in this file shipped beside the weights (the Hub folder, the MarianMT export).
CUSTOM_PIPELINES = {
    "translation": {
        "impl": "pipeline_vanilla_transformer.TranslationPipeline",
        "pt": ["AutoModelForSeq2SeqLM"],
        "type": "text",
    }
}


class TranslationPipeline(Pipeline):
    """Text in, translation out: tokenize, `generate()` (beam search settings from the model's generation config
    unless overridden), decode. Returns `[{"translation_text": ...}]` per input, like transformers 4's pipeline."""

    _load_tokenizer = True
    _load_processor = False
    _load_image_processor = False
    _load_video_processor = False
    _load_feature_extractor = False
    _pipeline_calls_generate = True

    def _sanitize_parameters(self, max_source_length: int | None = None, **generate_kwargs: Any):
        preprocess_params = {"max_source_length": max_source_length} if max_source_length is not None else {}
        return preprocess_params, generate_kwargs, {}

    def __call__(self, inputs: str | list[str], **kwargs: Any) -> list[dict[str, str]] | list[list[dict[str, str]]]:
        """Translate one text or a list of texts; generation keyword arguments (`num_beams`, `max_new_tokens`,
        `length_penalty`, ...) are passed to `generate()`."""
        if isinstance(inputs, str):
            return super().__call__(inputs, **kwargs)
        if not isinstance(inputs, list | tuple) or not all(isinstance(text, str) for text in inputs):
            raise ValueError(f"The translation pipeline takes a string or a list of strings, got {type(inputs)}.")
        results = super().__call__(list(inputs), **kwargs)
        return [result[0] if len(result) == 1 else result for result in results]

    def preprocess(self, text: str, max_source_length: int | None = None) -> dict[str, Any]:
        if not isinstance(text, str):
            raise ValueError(f"The translation pipeline takes strings, got {type(text)}.")
        return self.tokenizer(
            text, return_tensors="pt", truncation=max_source_length is not None, max_length=max_source_length
        )

    def _forward(self, model_inputs: dict[str, Any], **generate_kwargs: Any) -> dict[str, Any]:
        # the pipeline's generation defaults under the user's and the model's generation config
        generate_kwargs = self._prepare_generate_kwargs(generate_kwargs)
        return {"output_ids": self.model.generate(**model_inputs, **generate_kwargs)}

    def postprocess(self, model_outputs: dict[str, Any]) -> list[dict[str, str]]:
        return [
            {"translation_text": self.tokenizer.decode(ids, skip_special_tokens=True)}
            for ids in model_outputs["output_ids"]
        ]
