"""CTranslate2 export: this package's model described as CTranslate2's own `TransformerSpec`.

`VanillaTransformerConverter` is a `ctranslate2.converters.Converter` (the converter API CTranslate2 documents for new
model types); `export_ctranslate2` runs it. `generation_options` maps `generate()` settings to the options of
`ctranslate2.Translator.translate_batch` that give the same tokens. Needs the `ctranslate2` extra
(`pip install 'vanilla-transformer[ctranslate2]'`); `import vanilla_transformer` does not import this module.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import ctranslate2
import numpy as np
import torch
from ctranslate2.converters import utils as converter_utils
from ctranslate2.specs import common_spec, transformer_spec

from vanilla_transformer_ort.contract import TOKENIZER_FILES

from ..cli_parsers import check_model_folder
from ..model.configuration_vanilla_transformer import VanillaTransformerConfig
from ..model.embeddings import sinusoidal_positional_encoding
from ..model.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from . import CTRANSLATE2_QUANTIZATIONS as QUANTIZATIONS

MIN_POSITIONS = 1024  # default rows of the position table: max(MIN_POSITIONS, config.max_position_embeddings)
# CTranslate2 activations by transformers name (ACT2FN's "gelu" is the exact erf form: CTranslate2's GELU).
ACTIVATION_NAMES = {"relu": "RELU", "gelu": "GELU", "silu": "SWISH", "swish": "SWISH"}


def default_max_positions(config: VanillaTransformerConfig) -> int:
    return max(MIN_POSITIONS, config.max_position_embeddings)


def position_table(num_positions: int, d_model: int) -> np.ndarray:
    """Rows 0..num_positions-1 of the paper's interleaved sin/cos encoding (§3.5): (num_positions, d_model) float32.

    CTranslate2 reads row p for position p, and both stacks start at position 0 as this package does (the encoder's
    first source token, the decoder's start token), so the table needs no offset."""
    return sinusoidal_positional_encoding(torch.arange(num_positions), d_model).numpy()


def read_vocabulary(path: str | Path) -> list[str]:
    """Tokens in id order from a `tokenizer.json` (added tokens included) or a token → id `vocab.json`."""
    path = Path(path)
    if path.name.endswith("tokenizer.json"):
        from tokenizers import Tokenizer

        vocab = Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)
    else:
        vocab = json.loads(path.read_text(encoding="utf-8"))
    tokens = sorted(vocab, key=vocab.__getitem__)
    if [vocab[token] for token in tokens] != list(range(len(tokens))):
        raise ValueError(f"{path}: token ids are not 0..{len(tokens) - 1} without gaps; cannot list them in order.")
    return tokens


def _fit_vocabulary(tokens: list[str], size: int, source: Path, what: str) -> list[str]:
    """The vocabulary padded with unused placeholder tokens up to the embedding size (models often round it up)."""
    if len(tokens) > size:
        raise ValueError(f"{source} has {len(tokens)} tokens but the model's {what} has {size} rows.")
    existing, padded, index = set(tokens), list(tokens), 0
    while len(padded) < size:
        if f"<unused_{index}>" not in existing:
            padded.append(f"<unused_{index}>")
        index += 1
    return padded


def _find_vocabulary(folder: Path, names: tuple[str, ...]) -> Path | None:
    return next((folder / name for name in names if (folder / name).is_file()), None)


class VanillaTransformerConverter(ctranslate2.converters.Converter):
    """Converts a `VanillaTransformerForConditionalGeneration` folder into a CTranslate2 `TransformerSpec`.

    Args:
        model_dir: a `save_pretrained` folder (config, weights, `tokenizer.json`).
        tokenizer_dir: where the vocabulary lives, if not in `model_dir`.
        max_positions: rows of the position table, default max(1024, config.max_position_embeddings).
    """

    def __init__(
        self, model_dir: str | Path, tokenizer_dir: str | Path | None = None, max_positions: int | None = None
    ):
        self.model_dir = Path(model_dir)
        self.tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else self.model_dir
        self.max_positions = max_positions

    def _load(self) -> transformer_spec.TransformerSpec:
        model = VanillaTransformerForConditionalGeneration.from_pretrained(self.model_dir).eval()
        return build_spec(model, self.tokenizer_dir, self.max_positions)


def _vocabularies(config: VanillaTransformerConfig, folder: Path) -> tuple[list[str], list[str]]:
    """Source and target tokens in id order: `tokenizer.json` (or Marian's `vocab.json`); a separate target
    vocabulary from `target_vocab.json` when the decoder has its own embeddings of another size."""
    source_path = _find_vocabulary(folder, ("tokenizer.json", "vocab.json"))
    if source_path is None:
        raise ValueError(f"No tokenizer.json or vocab.json in {folder}: pass the tokenizer folder.")
    source = _fit_vocabulary(read_vocabulary(source_path), config.vocab_size, source_path, "vocab_size")
    decoder_vocab_size = _decoder_vocab_size(config)
    target_path = _find_vocabulary(folder, ("target_tokenizer.json", "target_vocab.json"))
    if target_path is None:
        if decoder_vocab_size != config.vocab_size:
            raise ValueError(
                f"`decoder_vocab_size` ({decoder_vocab_size}) differs from `vocab_size` ({config.vocab_size}) but "
                f"{folder} has no target_vocab.json (or target_tokenizer.json) for the target vocabulary."
            )
        return source, source
    target = read_vocabulary(target_path)
    return source, _fit_vocabulary(target, decoder_vocab_size, target_path, "decoder_vocab_size")


def _decoder_vocab_size(config: VanillaTransformerConfig) -> int:
    if getattr(config, "share_encoder_decoder_embeddings", True):
        return config.vocab_size
    return getattr(config, "decoder_vocab_size", None) or config.vocab_size


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to(torch.float32).cpu().numpy()


def _token(tokens: list[str], token_id: int | None, field: str) -> str:
    if token_id is None or not 0 <= token_id < len(tokens):
        raise ValueError(f"`{field}` = {token_id!r} is not an id of the vocabulary (size {len(tokens)}).")
    return tokens[token_id]


def check_exportable(config: VanillaTransformerConfig) -> None:
    """Raise a ValueError naming the field for settings a CTranslate2 `TransformerSpec` cannot express."""
    activation = getattr(config, "activation_function", "relu")
    if activation not in ACTIVATION_NAMES:
        raise ValueError(
            f"`activation_function` = {activation!r} has no CTranslate2 equivalent; "
            f"supported: {list(ACTIVATION_NAMES)}."
        )
    if config.d_model % config.encoder_attention_heads or config.d_model % config.decoder_attention_heads:
        raise ValueError("`d_model` must be divisible by `encoder_attention_heads` and `decoder_attention_heads`.")
    eos = config.eos_token_id
    if isinstance(eos, list) and len(eos) != 1:
        raise ValueError(
            f"`eos_token_id` = {eos}: a CTranslate2 model has one end token; pass the others at run time (end_token)."
        )
    if config.decoder_start_token_id is None:
        raise ValueError("`decoder_start_token_id` is None: CTranslate2 needs a decoder start token.")


def build_spec(
    model: VanillaTransformerForConditionalGeneration, tokenizer_dir: Path, max_positions: int | None = None
) -> transformer_spec.TransformerSpec:
    """The `TransformerSpec` of `model` with its weights, vocabularies and special tokens."""
    config = model.config
    check_exportable(config)
    max_positions = max_positions or default_max_positions(config)
    activation = getattr(common_spec.Activation, ACTIVATION_NAMES[getattr(config, "activation_function", "relu")])
    pre_norm = bool(getattr(config, "normalize_before", False))
    # Encoder and decoder specs are built separately: their head counts may differ (from_config takes one).
    encoder_spec = transformer_spec.TransformerEncoderSpec(
        config.encoder_layers, config.encoder_attention_heads, pre_norm=pre_norm, activation=activation
    )
    decoder_spec = transformer_spec.TransformerDecoderSpec(
        config.decoder_layers, config.decoder_attention_heads, pre_norm=pre_norm, activation=activation
    )
    spec = transformer_spec.TransformerSpec(encoder_spec, decoder_spec)

    table = position_table(max_positions, config.d_model)
    encoder, decoder = model.model.encoder, model.model.decoder
    for stack_spec, stack in ((encoder_spec, encoder), (decoder_spec, decoder)):
        stack_spec.scale_embeddings = float(stack.input_representation.embed_scale)  # √d_model, or 1 unscaled
        stack_spec.position_encodings.encodings = table
        if pre_norm:  # Deviation from paper (pre-LN): the stacks' final LayerNorm
            _set_layer_norm(stack_spec.layer_norm, stack.layer_norm)
    encoder_spec.embeddings[0].weight = _numpy(encoder.embed_tokens.weight)
    decoder_spec.embeddings.weight = _numpy(decoder.embed_tokens.weight)

    for layer_spec, layer in zip(encoder_spec.layer, encoder.layers, strict=True):
        _set_attention(layer_spec.self_attention, layer.self_attn, True)
        _set_layer_norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm)
        _set_ffn(layer_spec.ffn, layer)
    for layer_spec, layer in zip(decoder_spec.layer, decoder.layers, strict=True):
        _set_attention(layer_spec.self_attention, layer.self_attn, True)
        _set_layer_norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm)
        _set_attention(layer_spec.attention, layer.encoder_attn, False)
        _set_layer_norm(layer_spec.attention.layer_norm, layer.encoder_attn_layer_norm)
        _set_ffn(layer_spec.ffn, layer)

    decoder_spec.projection.weight = _numpy(model.lm_head.weight)
    if getattr(model.lm_head, "bias", None) is not None:
        decoder_spec.projection.bias = _numpy(model.lm_head.bias)
    final_logits_bias = getattr(model, "final_logits_bias", None)
    if getattr(config, "add_final_logits_bias", False) or final_logits_bias is not None:
        if final_logits_bias is None:
            raise ValueError("`add_final_logits_bias` is set but the model has no `final_logits_bias` buffer.")
        bias = _numpy(final_logits_bias).reshape(-1)  # (1, vocab) → (vocab,)
        if getattr(model.lm_head, "bias", None) is not None:
            bias = bias + _numpy(model.lm_head.bias)
        decoder_spec.projection.bias = bias

    source_tokens, target_tokens = _vocabularies(config, Path(tokenizer_dir))
    spec.register_source_vocabulary(source_tokens)
    spec.register_target_vocabulary(target_tokens)
    eos_id = config.eos_token_id[0] if isinstance(config.eos_token_id, list) else config.eos_token_id
    spec.config.eos_token = _token(target_tokens, eos_id, "eos_token_id")
    spec.config.decoder_start_token = _token(target_tokens, config.decoder_start_token_id, "decoder_start_token_id")
    bos_id = config.bos_token_id  # None in Marian configs; CTranslate2 only uses it with add_source_bos
    spec.config.bos_token = spec.config.eos_token if bos_id is None else _token(source_tokens, bos_id, "bos_token_id")
    spec.config.unk_token = "<unk>" if "<unk>" in target_tokens else spec.config.eos_token
    spec.config.layer_norm_epsilon = config.layer_norm_eps
    return spec


def _set_layer_norm(spec, module: torch.nn.LayerNorm) -> None:
    spec.gamma = _numpy(module.weight)
    spec.beta = _numpy(module.bias)


def _set_linear(spec, module: torch.nn.Linear) -> None:
    spec.weight = _numpy(module.weight)  # (out, in), as CTranslate2 stores it
    if module.bias is not None:
        spec.bias = _numpy(module.bias)


def _set_ffn(spec, layer) -> None:
    _set_linear(spec.linear_0, layer.fc1)
    _set_linear(spec.linear_1, layer.fc2)
    _set_layer_norm(spec.layer_norm, layer.final_layer_norm)


def _set_attention(spec, attention, is_self_attention: bool) -> None:
    """Self-attention: linear[0] = fused QKV, linear[1] = output; cross-attention: linear[0] = Q, linear[1] = fused
    KV, linear[2] = output (CTranslate2's layout)."""
    parts = [common_spec.LinearSpec() for _ in range(3)]
    for part, module in zip(parts, (attention.q_proj, attention.k_proj, attention.v_proj), strict=True):
        _set_linear(part, module)
    if is_self_attention:
        converter_utils.fuse_linear(spec.linear[0], parts)
    else:
        converter_utils.fuse_linear(spec.linear[0], parts[:1])
        converter_utils.fuse_linear(spec.linear[1], parts[1:])
    _set_linear(spec.linear[-1], attention.out_proj)


def export_ctranslate2(
    model_dir: str | Path,
    output_dir: str | Path,
    quantization: str | None = None,
    max_positions: int | None = None,
    tokenizer_dir: str | Path | None = None,
    force: bool = False,
) -> Path:
    """Convert a model folder to a CTranslate2 model folder; the tokenizer files are copied next to it.

    Args:
        quantization: None (float32 weights), "int8", "int8_float32" or "float16" (CTranslate2's weight types;
            the compute type is chosen when the model is loaded).
        max_positions: rows of the position table (default max(1024, config.max_position_embeddings)): sources and
            decoding lengths up to this many tokens; beyond, CTranslate2 raises "No position encodings are defined
            for positions >= N".
    Returns:
        The output folder.
    """
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"`quantization` must be one of {list(QUANTIZATIONS)} or None, got {quantization!r}.")
    if max_positions is not None and max_positions <= 0:
        raise ValueError(f"`max_positions` must be a positive integer, got {max_positions!r}.")
    check_model_folder(str(model_dir), must_exist=True)
    converter = VanillaTransformerConverter(model_dir, tokenizer_dir=tokenizer_dir, max_positions=max_positions)
    output = Path(converter.convert(str(output_dir), quantization=quantization, force=force))
    tokenizer_folder = Path(tokenizer_dir) if tokenizer_dir is not None else Path(model_dir)
    for name in TOKENIZER_FILES + ("generation_config.json",):
        if (tokenizer_folder / name).is_file():
            shutil.copy(tokenizer_folder / name, output / name)
    return output


def generation_options(
    num_beams: int = 1,
    max_new_tokens: int = 20,
    min_new_tokens: int = 0,
    length_penalty: float = 1.0,
) -> dict[str, Any]:
    """`Translator.translate_batch` options that decode as `generate(..., early_stopping=True)` does.

    transformers scores a finished beam hypothesis as sum_logprobs / generated_len ** length_penalty, with
    generated_len counting the EOS token; CTranslate2 divides by the hypothesis length, which counts EOS only with
    `return_end_token=True`. With `early_stopping=True`, transformers stops a sentence once num_beams hypotheses
    have finished, as CTranslate2 does with patience 1 (when length_penalty != 0; at 0 CTranslate2 stops as soon as the
    best beam finishes). Outputs then end with the EOS token, as `generate()`'s do.
    """
    return dict(
        beam_size=num_beams,
        patience=1,
        num_hypotheses=1,
        length_penalty=length_penalty,
        max_decoding_length=max_new_tokens,
        min_decoding_length=min_new_tokens,
        return_end_token=True,
    )
