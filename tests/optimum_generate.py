"""Generate with 🤗 Optimum's own `ORTModelForSeq2SeqLM` on a standard-layout export folder; run by
tests/test_optimum_interop.py with the interpreter of Optimum's own environment (tests/ecosystem_envs.py), never with
this package's.

    python optimum_generate.py REQUEST.json RESULT.json

REQUEST: {"folder": ..., "input_ids": [[...]], "attention_mask": [[...]], "runs": {name: generation settings}};
RESULT: {"versions": {...}, "decoder_inputs": [...], "is_merged": bool, "tokens": {name: [[...]]}}.
"""

import json
import sys
from importlib.metadata import version

import torch
from optimum.onnxruntime import ORTModelForSeq2SeqLM
from transformers import GenerationConfig


def main(request_path: str, result_path: str) -> None:
    with open(request_path) as file:
        request = json.load(file)
    # The graphs are in the folder's onnx/ subfolder: Optimum searches every *.onnx below the folder and takes the
    # standard names first (encoder_model.onnx, decoder_model_merged.onnx); config.json sits at the top.
    model = ORTModelForSeq2SeqLM.from_pretrained(request["folder"], use_merged=True, use_cache=True)
    input_ids = torch.tensor(request["input_ids"])
    attention_mask = torch.tensor(request["attention_mask"])
    tokens = {}
    for name, settings in request["runs"].items():
        # transformers fills the settings a passed generation config leaves at their defaults from the model's own
        # (the folder's generation_config.json asks for beam 4): replace the model's too.
        model.generation_config = GenerationConfig(**settings)
        output = model.generate(
            input_ids=input_ids, attention_mask=attention_mask, generation_config=GenerationConfig(**settings)
        )
        tokens[name] = output.tolist()
    result = {
        "versions": {name: version(name) for name in ("optimum-onnx", "optimum", "transformers", "onnxruntime")},
        "decoder_inputs": [i.name for i in model.decoder.session.get_inputs()],
        "is_merged": model.decoder.is_merged,
        "tokens": tokens,
    }
    with open(result_path, "w") as file:
        json.dump(result, file)


if __name__ == "__main__":
    main(*sys.argv[1:3])
