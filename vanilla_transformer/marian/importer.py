"""Exact import of MarianMT / OPUS-MT checkpoints (transformers' `MarianMTModel`) into this package's model.

Marian is the paper's post-LN Transformer with four differences, each converted exactly or refused:

- its sinusoids put all sines in the first half of the vector and all cosines in the second; the paper (and this
  package) interleave them at the same frequencies. The two layouts differ by a fixed permutation of the model
  dimension, so the residual stream is permuted instead of the positional encoding: embedding columns, the d_model
  side of every projection and the LayerNorm γ/β (`permutation.py`). Attention and the FFN never mix coordinates of
  the residual stream except through these weights, and LayerNorm's mean and variance do not depend on the order, so
  the logits are unchanged;
- the FFN activation (OPUS-MT uses swish), carried in `activation_function`;
- a trained bias added to the logits (`add_final_logits_bias`);
- separate source and target vocabularies in some checkpoints (`share_encoder_decoder_embeddings`,
  `decoder_vocab_size`).

`convert_marian` returns the model and a `ConversionReport`; `save_converted` writes a folder that loads with
`AutoModelForSeq2SeqLM` (with `import vanilla_transformer`, or `trust_remote_code=True` without it), fine-tunes with
scripts/train.py and exports with export/export_onnx.py, with Marian's tokenizer files and generation config.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers.utils import logging

from ..model.configuration_vanilla_transformer import ACTIVATIONS, VanillaTransformerConfig
from ..model.embeddings import sinusoidal_positional_encoding
from ..model.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from .permutation import interleave_permutation, permute_residual

logger = logging.get_logger(__name__)

# MarianConfig fields copied unchanged: they mean the same here.
COPIED_FIELDS = (
    "vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
    "encoder_ffn_dim", "decoder_ffn_dim", "max_position_embeddings", "dropout", "attention_dropout",
    "activation_dropout", "activation_function", "scale_embedding", "tie_word_embeddings",
    "share_encoder_decoder_embeddings", "pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id",
    "use_cache",
)  # fmt: skip
# MarianConfig fields that would change the computation, and the only values this conversion reproduces exactly.
REQUIRED_VALUES = {"encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0, "is_decoder": False}
# Marian's LayerNorms are `nn.LayerNorm(d_model)`, torch's default ε.
MARIAN_LAYER_NORM_EPS = 1e-5
# Largest |Marian's sinusoid table (permuted) - ours| accepted as "the same encodings" (float32 rounding).
POSITION_TOLERANCE = 1e-4


@dataclass
class ConversionReport:
    """What `convert_marian` did: the config it built, how each source tensor was converted, and checks."""

    source: str
    config: dict[str, Any]
    tensors: dict[str, str] = field(default_factory=dict)  # source name -> how it was converted
    recomputed: list[str] = field(default_factory=list)  # source tensors rebuilt in closed form, not copied
    position_table_max_diff: float = 0.0
    max_abs_logit_diff: float | None = None  # from `verify_conversion`, when run

    def __str__(self) -> str:
        kinds: dict[str, int] = {}
        for how in self.tensors.values():
            kinds[how] = kinds.get(how, 0) + 1
        lines = [f"Converted {self.source}: {len(self.tensors)} tensors"]
        lines += [f"  {count:4d} {how}" for how, count in sorted(kinds.items())]
        lines.append(
            f"  {len(self.recomputed):4d} positional tables recomputed in closed form "
            f"(max |Marian permuted - ours| = {self.position_table_max_diff:.2e})"
        )
        keys = ("activation_function", "share_encoder_decoder_embeddings", "vocab_size", "decoder_vocab_size")
        lines.append("  config: " + ", ".join(f"{k}={self.config[k]!r}" for k in keys))
        if self.max_abs_logit_diff is not None:
            lines.append(f"  max |logits - MarianMTModel logits| on a random batch: {self.max_abs_logit_diff:.2e}")
        return "\n".join(lines)


def config_from_marian(marian_config) -> VanillaTransformerConfig:
    """A `VanillaTransformerConfig` computing what `marian_config` computes; raises ValueError naming any
    MarianConfig field whose value cannot be reproduced exactly."""
    if getattr(marian_config, "model_type", None) != "marian":
        raise ValueError(f"Expected a MarianConfig (model_type 'marian'), got {type(marian_config).__name__}.")
    for name, required in REQUIRED_VALUES.items():
        value = getattr(marian_config, name, required)
        if value != required:
            raise ValueError(f"Cannot convert MarianConfig.{name}={value!r}: only {required!r} is supported.")
    if marian_config.activation_function not in ACTIVATIONS:
        raise ValueError(
            f"Cannot convert MarianConfig.activation_function={marian_config.activation_function!r}: this model "
            f"supports {list(ACTIVATIONS)}."
        )
    if marian_config.d_model % 2 != 0:
        raise ValueError(f"Cannot convert MarianConfig.d_model={marian_config.d_model}: sin/cos pairs need it even.")
    values = {name: getattr(marian_config, name) for name in COPIED_FIELDS}
    decoder_vocab_size = marian_config.decoder_vocab_size or marian_config.vocab_size
    if marian_config.share_encoder_decoder_embeddings and decoder_vocab_size != marian_config.vocab_size:
        raise ValueError(
            f"Cannot convert MarianConfig.decoder_vocab_size={decoder_vocab_size} with "
            f"share_encoder_decoder_embeddings=True and vocab_size={marian_config.vocab_size}: MarianMTModel itself "
            "ignores decoder_vocab_size there and builds a decoder of vocab_size rows."
        )
    return VanillaTransformerConfig(
        **values,
        decoder_vocab_size=decoder_vocab_size,
        add_final_logits_bias=True,
        layer_norm_eps=MARIAN_LAYER_NORM_EPS,
        normalize_before=False,
        architectures=["VanillaTransformerForConditionalGeneration"],
    )


def _load_marian(model_or_path) -> tuple[Any, str]:
    if isinstance(model_or_path, (str, os.PathLike)):
        from transformers import MarianMTModel

        return MarianMTModel.from_pretrained(model_or_path, dtype=torch.float32), str(model_or_path)
    return model_or_path, type(model_or_path).__name__


def convert_marian(model_or_path) -> tuple[VanillaTransformerForConditionalGeneration, ConversionReport]:
    """Convert a `MarianMTModel` (an instance, a folder or a Hub id) exactly; returns the model and a report.

    Raises ValueError for a config field that cannot be reproduced, a tensor without a counterpart (either way),
    or a positional table that is not Marian's sinusoid.
    """
    marian, source = _load_marian(model_or_path)
    if type(marian).__name__ != "MarianMTModel":
        raise ValueError(f"Expected a MarianMTModel, got {type(marian).__name__}.")
    config = config_from_marian(marian.config)
    model = VanillaTransformerForConditionalGeneration(config)
    report = ConversionReport(source=source, config=config.to_dict())
    perm = interleave_permutation(config.d_model)

    source_state = {name: tensor.detach().float() for name, tensor in marian.state_dict().items()}
    # Marian's saved checkpoints leave out the sinusoid tables; a live model holds them. Either way they are not
    # weights here: check that, permuted, they are our closed form, and record them as recomputed.
    for name in [n for n in source_state if n.endswith("embed_positions.weight")]:
        table = source_state.pop(name)[:, perm]  # (positions, d_model)
        ours = sinusoidal_positional_encoding(torch.arange(table.shape[0]), config.d_model)
        report.position_table_max_diff = max(report.position_table_max_diff, float((table - ours).abs().max()))
        report.recomputed.append(name)
    if report.position_table_max_diff > POSITION_TOLERANCE:
        raise ValueError(
            f"Marian's positional table differs from the permuted sinusoid by {report.position_table_max_diff:.3g}: "
            "not the checkpoint layout this conversion assumes."
        )

    target_state = model.state_dict()
    converted = {}
    for name, target in target_state.items():
        if name not in source_state:
            raise ValueError(f"The Marian checkpoint has no tensor {name!r} for this model.")
        tensor, how = permute_residual(name, source_state[name], perm)
        if tensor.shape != target.shape:
            raise ValueError(f"{name}: Marian shape {tuple(tensor.shape)} != expected {tuple(target.shape)}.")
        converted[name] = tensor.contiguous()
        report.tensors[name] = how
    unused = sorted(set(source_state) - set(converted))
    if unused:
        raise ValueError(f"Marian tensors with no place in the converted model (would be lost): {unused}")
    model.load_state_dict(converted, strict=True)
    _check_ties(model, converted)
    model.generation_config = copy.deepcopy(marian.generation_config)
    model.eval()
    logger.info("%s", report)
    return model, report


def _check_ties(model: VanillaTransformerForConditionalGeneration, converted: dict[str, torch.Tensor]) -> None:
    """A tied parameter takes the last tensor loaded into it: every name tied to it must have carried the same."""
    by_parameter: dict[int, list[str]] = {}
    state = model.state_dict(keep_vars=True)
    for name, tensor in state.items():
        by_parameter.setdefault(id(tensor), []).append(name)
    for names in by_parameter.values():
        first = converted[names[0]]
        for other in names[1:]:
            if not torch.equal(first, converted[other]):
                raise ValueError(f"{names[0]} and {other} are one parameter here but differ in the Marian checkpoint.")


def from_marian(model_or_path) -> VanillaTransformerForConditionalGeneration:
    """`convert_marian` without the report (it is logged at INFO level)."""
    return convert_marian(model_or_path)[0]


@torch.no_grad()
def verify_conversion(marian, model: VanillaTransformerForConditionalGeneration, seed: int = 0) -> float:
    """max |logits(model) - logits(marian)| on a random padded batch (fp32, eval mode)."""
    generator = torch.Generator().manual_seed(seed)
    config = model.config
    pad = config.pad_token_id
    low = 1 if pad == 0 else 0
    source = torch.randint(low, config.vocab_size, (2, 11), generator=generator)
    source[source == pad] = config.eos_token_id
    mask = torch.ones_like(source)
    mask[1, 7:] = 0
    source[1, 7:] = pad
    target = torch.randint(low, config.target_vocab_size, (2, 6), generator=generator)
    target[:, 0] = config.decoder_start_token_id
    marian, model = marian.eval(), model.eval()
    expected = marian(input_ids=source, attention_mask=mask, decoder_input_ids=target).logits
    actual = model(input_ids=source, attention_mask=mask, decoder_input_ids=target).logits
    return float((expected - actual).abs().max())


def save_converted(
    model_or_path, output_dir: str | os.PathLike, tokenizer=None, verify: bool = True
) -> ConversionReport:
    """Convert a MarianMTModel and write a folder with the model, its generation config and Marian's tokenizer files
    (`source.spm`, `target.spm`, `vocab.json`, `tokenizer_config.json`; loaded by `AutoTokenizer` as
    MarianTokenizer, and by the onnxruntime runtime with the `sentencepiece` package).

    Args:
        model_or_path: a MarianMTModel, or a folder / Hub id of one.
        output_dir: the folder to write.
        tokenizer: a MarianTokenizer; by default loaded from `model_or_path` when it is a folder or Hub id.
        verify: compare the logits of both models on a random batch and record the largest difference.
    """
    marian, _ = _load_marian(model_or_path)
    model, report = convert_marian(marian)
    if verify:
        report.max_abs_logit_diff = verify_conversion(marian, model)
    if tokenizer is None:
        if not isinstance(model_or_path, (str, os.PathLike)):
            raise ValueError("Pass the MarianTokenizer with a model instance (or give a folder / Hub id).")
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_or_path)
    if type(tokenizer).__name__ != "MarianTokenizer":
        raise ValueError(f"Expected a MarianTokenizer, got {type(tokenizer).__name__}.")
    output_dir = Path(output_dir)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return report


__all__ = [
    "ConversionReport",
    "config_from_marian",
    "convert_marian",
    "from_marian",
    "save_converted",
    "verify_conversion",
]
