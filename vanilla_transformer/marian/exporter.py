"""Exact export of this package's model to transformers' native `MarianMTModel`: the inverse of `importer.py`.

MarianMT is the paper's post-LN Transformer (§3.1) with the sinusoids of §3.5 laid out as [sin | cos] halves instead
of interleaved pairs. Same frequencies, so the two layouts differ by a fixed permutation of the model dimension:
`to_marian` permutes the residual stream back (every d_model axis of the weights, with `argsort` of
`permutation.interleave_permutation`), which leaves the logits unchanged while the positional table becomes
Marian's own.
`save_marian` writes a folder that loads with `MarianMTModel.from_pretrained`, `AutoModelForSeq2SeqLM` and
`AutoTokenizer` without this package and without remote model code. (CTranslate2's `ct2-transformers-converter`
assumes OPUS-MT's conventions: a <pad> appended last, a decoder starting from its zero embedding, one head count;
docs/marian.md. `vt-export-ctranslate2` converts our models exactly.)

Marian's positional table has a fixed number of rows (`max_position_embeddings`); ours has no limit. The exported
table has `max(1024, config.max_position_embeddings)` rows unless `max_positions` says otherwise
(`default_max_positions`): sources and outputs must stay shorter than that.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import torch
from transformers import GenerationConfig, MarianConfig, MarianMTModel
from transformers.activations import ACT2FN
from transformers.utils import logging

from ..export.output_folder import check_output_dir, staged_output
from ..model.configuration_vanilla_transformer import VanillaTransformerConfig
from ..model.embeddings import sinusoidal_positional_encoding
from ..model.modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from ..model.pipeline_vanilla_transformer import CUSTOM_PIPELINES
from .importer import MARIAN_LAYER_NORM_EPS, POSITION_TOLERANCE
from .permutation import interleave_permutation, permute_residual
from .tokenizer import FAST_TOKENIZER_CLASS, tokenizer_kind, write_tokenizer

logger = logging.get_logger(__name__)

MIN_POSITIONS = 1024  # default rows of Marian's position table: max(MIN_POSITIONS, config.max_position_embeddings)
DEFAULT_NUM_BEAMS = 4  # generation defaults written when the model's own generation config sets none (§6.1)
DEFAULT_MAX_LENGTH = 512
# transformers 5 removed pipeline("translation"); this transformers-only file (no model code) brings it back through
# config.json's `custom_pipelines`, so the pipeline, and only it, needs `trust_remote_code=True`.
PIPELINE_FILE = Path(__file__).resolve().parents[1] / "model" / "pipeline_vanilla_transformer.py"


def default_max_positions(config: VanillaTransformerConfig) -> int:
    """Rows of the exported position table when none is asked for: max(1024, config.max_position_embeddings)."""
    return max(MIN_POSITIONS, config.max_position_embeddings)


def marian_config_from(config: VanillaTransformerConfig, max_positions: int | None = None) -> MarianConfig:
    """The `MarianConfig` computing exactly what `config` computes; ValueError naming the field for what MarianMT
    cannot express: pre-LN, an activation outside transformers' ACT2FN, a LayerNorm ε other than 1e-5 (Marian
    hard-codes `nn.LayerNorm`'s), no decoder start token.

    Args:
        config: this package's config.
        max_positions: rows of Marian's sinusoid table, the longest source and output it can read (default
            `default_max_positions(config)`); at least `config.max_position_embeddings`.
    """
    if getattr(config, "model_type", None) != VanillaTransformerConfig.model_type:
        raise ValueError(f"Expected a VanillaTransformerConfig, got {type(config).__name__}.")
    if config.normalize_before:
        raise ValueError("Cannot export normalize_before=True (pre-LN): MarianMT is post-LN only.")
    if config.activation_function not in ACT2FN:
        raise ValueError(
            f"Cannot export activation_function={config.activation_function!r}: not in transformers' ACT2FN, "
            "which MarianMT's FFN uses."
        )
    if config.layer_norm_eps != MARIAN_LAYER_NORM_EPS:
        raise ValueError(
            f"Cannot export layer_norm_eps={config.layer_norm_eps!r}: MarianMT's LayerNorms use "
            f"{MARIAN_LAYER_NORM_EPS} (torch's default), fixed."
        )
    if config.decoder_start_token_id is None:
        raise ValueError("Cannot export decoder_start_token_id=None: MarianMT needs a decoder start token.")
    if max_positions is None:
        max_positions = default_max_positions(config)
    if isinstance(max_positions, bool) or not isinstance(max_positions, int) or max_positions < 1:
        raise ValueError(f"max_positions must be a positive integer, got {max_positions!r}.")
    if max_positions < config.max_position_embeddings:
        raise ValueError(
            f"max_positions={max_positions} is below the model's max_position_embeddings="
            f"{config.max_position_embeddings}: the exported model could not read inputs this model was made for."
        )
    return MarianConfig(
        vocab_size=config.vocab_size,
        decoder_vocab_size=config.target_vocab_size,
        share_encoder_decoder_embeddings=config.share_encoder_decoder_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
        d_model=config.d_model,
        encoder_layers=config.encoder_layers,
        decoder_layers=config.decoder_layers,
        encoder_attention_heads=config.encoder_attention_heads,
        decoder_attention_heads=config.decoder_attention_heads,
        encoder_ffn_dim=config.encoder_ffn_dim,
        decoder_ffn_dim=config.decoder_ffn_dim,
        activation_function=config.activation_function,
        dropout=config.dropout,
        attention_dropout=config.attention_dropout,
        activation_dropout=config.activation_dropout,
        encoder_layerdrop=0.0,
        decoder_layerdrop=0.0,
        init_std=config.init_std if config.init_std is not None else 0.02,  # initialisation only
        scale_embedding=config.scale_embedding,  # √d_model in both (§3.4)
        max_position_embeddings=max_positions,
        pad_token_id=config.pad_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        decoder_start_token_id=config.decoder_start_token_id,
        forced_eos_token_id=None,  # MarianConfig's default (0) is OPUS-MT's </s>; generation_config.json decides
        use_cache=config.use_cache,
        is_encoder_decoder=True,
        architectures=["MarianMTModel"],
    )


def _tie_groups(module: torch.nn.Module) -> list[list[str]]:
    """State-dict names that are one parameter in `module` (tied weights), groups of two or more."""
    by_parameter: dict[int, list[str]] = {}
    for name, tensor in module.state_dict(keep_vars=True).items():
        by_parameter.setdefault(id(tensor), []).append(name)
    return [names for names in by_parameter.values() if len(names) > 1]


@torch.no_grad()
def to_marian(model: VanillaTransformerForConditionalGeneration, max_positions: int | None = None) -> MarianMTModel:
    """`model` as a `MarianMTModel` with the same logits (up to float rounding), in eval mode.

    Every tensor of ours is mapped to one of Marian's with the inverse of `importer.py`'s permutation; Marian's
    positional tables are its own (checked against our closed form, permuted) and its `final_logits_bias` is ours or
    zeros. A tensor left over on either side, or tied weights that would merge different values, is a ValueError.
    """
    if not isinstance(model, VanillaTransformerForConditionalGeneration):
        raise ValueError(f"Expected a VanillaTransformerForConditionalGeneration, got {type(model).__name__}.")
    config = model.config
    marian = MarianMTModel(marian_config_from(config, max_positions)).eval()
    inverse = torch.argsort(interleave_permutation(config.d_model))  # marian[..., k] = ours[..., inverse[k]]
    ours = {name: tensor.detach().float().cpu() for name, tensor in model.state_dict().items()}

    converted: dict[str, torch.Tensor] = {}
    position_diff = 0.0
    for name, target in marian.state_dict().items():
        if name.endswith("embed_positions.weight"):
            # Marian's own [sin | cos] table, which the inverse permutation must turn into our interleaved one.
            table = target.float()[:, interleave_permutation(config.d_model)]  # (max_positions, d_model)
            closed_form = sinusoidal_positional_encoding(torch.arange(table.shape[0]), config.d_model)
            position_diff = max(position_diff, float((table - closed_form).abs().max()))
            converted[name] = target
        elif name == "final_logits_bias" and name not in ours:
            converted[name] = torch.zeros_like(target)  # ours adds no bias; Marian always has the buffer
        elif name in ours:
            tensor, _ = permute_residual(name, ours.pop(name), inverse)
            if tensor.shape != target.shape:
                raise ValueError(f"{name}: shape {tuple(tensor.shape)} != MarianMTModel's {tuple(target.shape)}.")
            converted[name] = tensor.contiguous()
        else:
            raise ValueError(f"MarianMTModel has a tensor {name!r} with no counterpart in this model.")
    if ours:
        raise ValueError(f"Tensors of this model with no place in MarianMTModel (would be lost): {sorted(ours)}")
    if position_diff > POSITION_TOLERANCE:
        raise ValueError(f"MarianMTModel's positional table differs from ours, permuted, by {position_diff:.3g}.")
    for names in _tie_groups(marian):
        # a tied parameter keeps the last tensor loaded into it: every name must carry the same values
        if any(not torch.equal(converted[names[0]], converted[other]) for other in names[1:]):
            raise ValueError(f"{', '.join(names)} are one parameter in MarianMTModel but differ in this model.")
    marian.load_state_dict(converted, strict=True)
    marian.to(model.dtype)
    marian.generation_config = marian_generation_config(model, marian.config)
    return marian


def marian_generation_config(
    model: VanillaTransformerForConditionalGeneration, marian_config: MarianConfig
) -> GenerationConfig:
    """The model's generation config with the special tokens of its config; beam 4 where its beam size is 1
    (transformers' default), a 512-token limit where it sets none; lengths capped at the position table."""
    generation = copy.deepcopy(model.generation_config)
    config = model.config
    for field in ("decoder_start_token_id", "bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(generation, field, getattr(config, field))
    generation._from_model_config = False  # its own file: not to be rebuilt from config.json
    explicit = generation.to_diff_dict()
    if "num_beams" not in explicit:
        generation.num_beams = DEFAULT_NUM_BEAMS
    limit = marian_config.max_position_embeddings  # decoder positions 0 .. max_length - 1
    generation.max_length = min(explicit.get("max_length", DEFAULT_MAX_LENGTH), limit)
    if generation.max_new_tokens is not None:
        generation.max_new_tokens = min(generation.max_new_tokens, limit - 1)
    return generation


def _model_folder(model_or_dir, max_positions: int | None = None) -> Path | None:
    """The folder of `model_or_dir` (None for a model instance), checked to hold a model MarianMT can compute before
    any weight is loaded."""
    if isinstance(model_or_dir, VanillaTransformerForConditionalGeneration):
        return None
    if not isinstance(model_or_dir, (str, os.PathLike)):
        raise ValueError(
            f"Expected a model folder or a VanillaTransformerForConditionalGeneration, got {model_or_dir!r}."
        )
    folder = Path(model_or_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"Model folder {str(folder)!r} does not exist.")
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{str(folder)!r} is not a model folder (no config.json).")
    model_type = json.loads(config_file.read_text(encoding="utf-8")).get("model_type")
    if model_type != VanillaTransformerConfig.model_type:
        raise ValueError(f"{str(folder)!r} holds a {model_type!r} model, not a vanilla_transformer one.")
    marian_config_from(VanillaTransformerConfig.from_pretrained(folder), max_positions)
    return folder


def _load_model(model_or_dir) -> VanillaTransformerForConditionalGeneration:
    folder = _model_folder(model_or_dir)
    if folder is None:
        return model_or_dir
    return VanillaTransformerForConditionalGeneration.from_pretrained(folder).eval()


def save_marian(
    model_or_dir: VanillaTransformerForConditionalGeneration | str | os.PathLike,
    output_dir: str | os.PathLike,
    tokenizer_dir: str | os.PathLike | None = None,
    overwrite: bool = False,
    max_positions: int | None = None,
) -> Path:
    """Write a native MarianMT folder: config.json (model_type marian), model.safetensors, generation_config.json,
    the tokenizer, and `pipeline_vanilla_transformer.py` for `pipeline("translation", ..., trust_remote_code=True)`.

    The folder is built in a temporary folder beside `output_dir` and renamed into place at the end, so a failure
    leaves nothing half-written.

    Args:
        model_or_dir: a model, or a folder saved by this package (vt-train's --output_dir).
        output_dir: the folder to write; an existing non-empty one is refused unless `overwrite`.
        tokenizer_dir: where the tokenizer is (default: the model folder; required with a model instance). A fast
            tokenizer (tokenizer.json) is written with `tokenizer_class` PreTrainedTokenizerFast; Marian's
            sentencepiece files (a model imported from MarianMT) are copied unchanged.
        overwrite: replace a non-empty `output_dir`.
        max_positions: rows of Marian's positional table (default `default_max_positions(config)`).
    Returns:
        The output folder.
    """
    output = Path(output_dir)
    check_output_dir(output, overwrite)
    model_folder = _model_folder(model_or_dir, max_positions)  # the cheap checks first, weights last
    if tokenizer_dir is None and model_folder is None:
        raise ValueError("Pass tokenizer_dir with a model instance: the export needs the tokenizer's files.")
    tokenizer_folder = Path(tokenizer_dir) if tokenizer_dir is not None else model_folder
    if not tokenizer_folder.is_dir():
        raise FileNotFoundError(f"Tokenizer folder {str(tokenizer_folder)!r} does not exist.")
    kind = tokenizer_kind(tokenizer_folder)
    model = _load_model(model_or_dir)
    marian = to_marian(model, max_positions)
    table_rows = marian.config.max_position_embeddings

    with staged_output(output) as stage:
        marian.config.custom_pipelines = CUSTOM_PIPELINES
        marian.save_pretrained(stage)
        write_tokenizer(tokenizer_folder, kind, stage, table_rows, model.config)
        shutil.copy2(PIPELINE_FILE, stage / PIPELINE_FILE.name)
    logger.info("Wrote MarianMTModel folder %s (%d positions)", output, table_rows)
    return output


def ctranslate2_converter_issues(marian_dir: str | os.PathLike) -> list[str]:
    """Why CTranslate2's own `ct2-transformers-converter` would not convert an exported folder exactly: its
    `MarianMTLoader` assumes OPUS-MT's conventions. Empty when the folder follows them (a model imported from OPUS-MT
    with equal head counts does).

    1. The vocabulary ends with the <pad> that transformers' OPUS-MT conversion appends: the loader drops the last
       row of the embeddings and the output projection, and the last token only if it is "<pad>".
    2. The decoder starts from a zero embedding (OPUS-MT's <pad> row), whatever `decoder_start_token_id` says.
    3. One head count for both stacks (`TransformerSpec.from_config` takes the encoder's).
    """
    from safetensors import safe_open

    folder = Path(marian_dir)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    issues = []
    if (folder / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        vocab = Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab(with_added_tokens=True)
    else:
        vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    last = max(vocab, key=vocab.__getitem__)
    if last != "<pad>":
        issues.append(
            f"the vocabulary ends with {last!r}, not OPUS-MT's appended <pad>: the converter drops the last row of "
            "the embeddings and fails"
        )
    start = config["decoder_start_token_id"]
    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        saved = set(weights.keys())  # a safetensors handle, not a dict
        name = next(n for n in ("model.decoder.embed_tokens.weight", "model.shared.weight") if n in saved)
        row = weights.get_slice(name)[start : start + 1]  # (1, d_model)
    if bool(row.abs().max() > 0):
        issues.append(
            f"the decoder starts from token {start}, whose embedding is not zero: the converter starts from a zero "
            "embedding (OPUS-MT's <pad>)"
        )
    if config["encoder_attention_heads"] != config["decoder_attention_heads"]:
        issues.append(
            f"the stacks have {config['encoder_attention_heads']} and {config['decoder_attention_heads']} attention "
            "heads: the converter gives the decoder the encoder's count"
        )
    return issues


@torch.no_grad()
def verify_export(model_or_dir, marian_dir: str | os.PathLike, seed: int = 0) -> float:
    """max |logits(MarianMTModel from `marian_dir`) - logits(ours)| in fp32 on a random padded batch whose source and
    target run past `max_position_embeddings` (up to 8 positions, within Marian's table)."""
    model = _load_model(model_or_dir)
    model = copy.deepcopy(model).float().eval() if model.dtype != torch.float32 else model.eval()
    marian = MarianMTModel.from_pretrained(marian_dir, dtype=torch.float32).eval()
    config = model.config
    length = min(config.max_position_embeddings + 8, marian.config.max_position_embeddings)
    generator = torch.Generator().manual_seed(seed)
    source = torch.randint(0, config.vocab_size, (2, length), generator=generator)  # (batch, src_len)
    mask = torch.ones_like(source)
    mask[1, length // 2 :] = 0  # the second row padded
    target = torch.randint(0, config.target_vocab_size, (2, length), generator=generator)  # (batch, tgt_len)
    target[:, 0] = config.decoder_start_token_id
    expected = model(input_ids=source, attention_mask=mask, decoder_input_ids=target).logits
    actual = marian(input_ids=source, attention_mask=mask, decoder_input_ids=target).logits
    return float((expected - actual).abs().max())


__all__ = [
    "CUSTOM_PIPELINES",
    "FAST_TOKENIZER_CLASS",
    "MIN_POSITIONS",
    "ctranslate2_converter_issues",
    "default_max_positions",
    "marian_config_from",
    "marian_generation_config",
    "save_marian",
    "to_marian",
    "verify_export",
]
