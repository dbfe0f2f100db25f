"""Validation of an ONNX export against PyTorch on a grid of shapes (batch, lengths, past, padding): the last step
after `export.export_model`, which never calls it.

The oracle is the model's own encoder and cached decoder; the checked path is the deployed one: the encoder graph,
then the decoder graph fed the oracle's past. fp16 and int8 graphs run through the same code (fp16 I/O handled).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import DynamicCache, EncoderDecoderCache

from vanilla_transformer_ort.contract import (
    ATTENTION_MASK,
    DECODER_FILE,
    ENCODER_ATTENTION_MASK,
    ENCODER_FILE,
    INPLACE_DECODER_FILE,
    INPUT_IDS,
    LAST_HIDDEN_STATE,
    LOGITS,
    MANIFEST_FILE,
    PAST_PREFIX,
    PRESENT_PREFIX,
    SEQUENCE_LENGTHS,
    TOTAL_SEQUENCE_LENGTH,
    cache_names,
    is_self_attention,
    past_name,
    read_manifest,
)
from vanilla_transformer_ort.sessions import create_session, session_options

from .graphs import export_graphs
from .inplace_decoder import export_inplace_decoder

FP32_TOLERANCE = 1e-4


@dataclass(frozen=True)
class GridCase:
    """One validation shape: batch, source length, new decoder tokens, past length, padded source rows."""

    batch: int
    source_len: int
    target_len: int
    past_len: int
    padded: bool


def validation_grid(max_positions: int) -> list[GridCase]:
    """Batch > 1 with padding, past 0 and > 0, one and several new tokens, lengths beyond `max_positions`."""
    return [
        GridCase(1, 5, 1, 0, False),
        GridCase(3, 11, 1, 0, True),
        GridCase(3, 11, 1, 6, True),
        GridCase(2, 4, 3, 2, False),
        GridCase(2, 7, 4, 0, True),
        GridCase(1, 9, 1, 4, False),
        GridCase(2, max_positions + 3, 2, max_positions + 1, True),
    ]


def _case_inputs(case: GridCase, vocab_size: int, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(4, vocab_size, (case.batch, case.source_len), generator=generator)
    mask = torch.ones(case.batch, case.source_len, dtype=torch.int64)
    if case.padded:
        for row in range(1, case.batch):  # right padding of different lengths; row 0 stays full
            keep = max(1, case.source_len - 2 * row)
            mask[row, keep:] = 0
            input_ids[row, keep:] = 0
    prefix = torch.randint(4, vocab_size, (case.batch, case.past_len), generator=generator)
    new_ids = torch.randint(4, vocab_size, (case.batch, case.target_len), generator=generator)
    return {"input_ids": input_ids, "attention_mask": mask, "prefix": prefix, "new_ids": new_ids}


@torch.no_grad()
def _reference(model: nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """PyTorch oracle: the model's own encoder and cached decoder path (no wrapper involved)."""
    config = model.config
    encoder_states = model.model.encoder(
        input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], return_dict=True
    ).last_hidden_state
    cache = EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))
    decoder_kwargs = {
        "encoder_hidden_states": encoder_states,
        "encoder_attention_mask": inputs["attention_mask"],
        "use_cache": True,
        "return_dict": True,
    }
    past: list[np.ndarray] = []
    if inputs["prefix"].shape[1] > 0:
        cache = model.model.decoder(input_ids=inputs["prefix"], cache=cache, **decoder_kwargs).cache
        for layer in cache.self_attention_cache.layers:
            past += [layer.keys.numpy().copy(), layer.values.numpy().copy()]
    outputs = model.model.decoder(input_ids=inputs["new_ids"], cache=cache, **decoder_kwargs)
    logits = model.lm_head(outputs.last_hidden_state)  # (batch, tgt_len, vocab)
    if getattr(model, "final_logits_bias", None) is not None:
        logits = logits + model.final_logits_bias
    result = {LAST_HIDDEN_STATE: encoder_states.numpy(), LOGITS: logits.numpy()}
    presents = []  # in `cache_names` order: per layer self-attention key, value, cross-attention key, value
    for i in range(config.decoder_layers):
        own, cross = outputs.cache.self_attention_cache.layers[i], outputs.cache.cross_attention_cache.layers[i]
        presents += [own.keys.numpy(), own.values.numpy(), cross.keys.numpy(), cross.values.numpy()]
    result.update(zip(cache_names(config.decoder_layers, PRESENT_PREFIX), presents, strict=True))
    if past:
        past_names = [n for n in cache_names(config.decoder_layers, PAST_PREFIX) if is_self_attention(n)]
        result.update(zip(past_names, past, strict=True))
    return result


def _float_type(session, name: str) -> type:
    kind = next(i.type for i in session.get_inputs() if i.name == name)
    return np.float16 if kind == "tensor(float16)" else np.float32


def _run_onnx(encoder, decoder, config, inputs: dict[str, torch.Tensor], reference: dict) -> dict[str, np.ndarray]:
    """The deployed path: encoder graph once, then the decoder graph on the reference past."""
    enc_names = [o.name for o in encoder.get_outputs()]
    enc_feed = {INPUT_IDS: inputs["input_ids"].numpy(), ATTENTION_MASK: inputs["attention_mask"].numpy()}
    enc_out = dict(zip(enc_names, encoder.run(None, enc_feed), strict=True))
    heads = config.decoder_attention_heads
    d_head = config.d_model // heads
    batch, past_len = inputs["prefix"].shape
    feed = {INPUT_IDS: inputs["new_ids"].numpy(), ENCODER_ATTENTION_MASK: inputs["attention_mask"].numpy()}
    feed.update((past_name(name), value) for name, value in enc_out.items() if name != LAST_HIDDEN_STATE)
    for name in cache_names(config.decoder_layers, PAST_PREFIX):
        if is_self_attention(name):
            dtype = _float_type(decoder, name)
            empty = np.zeros((batch, heads, 0, d_head), dtype=dtype)
            feed[name] = reference[name].astype(dtype) if past_len else empty
    dec_names = [o.name for o in decoder.get_outputs()]
    return {**enc_out, **dict(zip(dec_names, decoder.run(None, feed), strict=True))}


INPLACE_BEAMS = 2  # rows per source fed to the in-place decoder: its beams share one copy of the cross K/V
INPLACE_SLACK = 3  # cache positions beyond the total length, filled with values the graph must never read


def _run_inplace(decoder, config, inputs: dict[str, torch.Tensor], reference: dict) -> dict[str, np.ndarray]:
    """The in-place decoder on the reference past, each source repeated `INPLACE_BEAMS` times, in buffers larger
    than needed. Returns the logits of the first row of each source and the written part of the cache.

    GroupQueryAttention takes several new tokens after a past for one row only: such cases run row by row.
    """
    batch, past_len = inputs["prefix"].shape
    new_ids = inputs["new_ids"].numpy()
    total = past_len + new_ids.shape[1]
    several_after_past = new_ids.shape[1] > 1 and past_len > 0
    if several_after_past and batch > 1:
        parts = []
        for row in range(batch):
            one = slice(row, row + 1)
            row_inputs, row_reference = ({k: v[one] for k, v in d.items()} for d in (inputs, reference))
            parts.append(_run_inplace(decoder, config, row_inputs, row_reference))
        return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
    beams = 1 if several_after_past else INPLACE_BEAMS
    heads = config.decoder_attention_heads
    feed = {
        INPUT_IDS: np.repeat(new_ids, beams, axis=0),
        ENCODER_ATTENTION_MASK: inputs["attention_mask"].numpy(),
        TOTAL_SEQUENCE_LENGTH: np.array(total, dtype=np.int32),
        SEQUENCE_LENGTHS: np.full(batch * beams, total, dtype=np.int32),
    }
    d_head = config.d_model // heads
    never_read = np.random.default_rng(0).normal(0, 1e3, (batch * beams, heads, INPLACE_SLACK, d_head))
    for name in cache_names(config.decoder_layers, PAST_PREFIX):
        if not is_self_attention(name):  # once per source
            feed[name] = reference[name.replace(f"{PAST_PREFIX}.", f"{PRESENT_PREFIX}.", 1)]
            continue
        buffer = np.zeros((batch * beams, heads, total, d_head), dtype=np.float32)
        if past_len:
            buffer[:, :, :past_len] = np.repeat(reference[name], beams, axis=0)
        feed[name] = np.concatenate([buffer, never_read.astype(np.float32)], axis=2)
    names = [o.name for o in decoder.get_outputs()]
    outputs = dict(zip(names, decoder.run(None, feed), strict=True))
    for name in names[1:]:  # both beams of a source hold the same cache
        outputs[name] = outputs[name][:, :, :total]
        if not np.array_equal(outputs[name][::beams], outputs[name][beams - 1 :: beams]):
            raise ValueError(f"In-place decoder: the beams of one source got different {name}")
    return {name: value[::beams] for name, value in outputs.items()}


def validate_export(model: nn.Module, output_dir: str | os.PathLike, grid: list[GridCase] | None = None) -> dict:
    """Compare onnxruntime (CPU) with PyTorch over a shape grid; returns max abs differences per output kind.

    Returns a dict with `encoder` (hidden state and cross K/V), `logits`, `present`, where the folder has the in-place
    decoder `inplace_logits` and `inplace_present`, and per-case rows.
    """
    model = model.eval()
    config = model.config
    grid = grid or validation_grid(config.max_position_embeddings)
    options = session_options(1)  # the sessions the runtime builds, graph optimizations included
    output_dir = Path(output_dir)
    encoder = create_session(output_dir / ENCODER_FILE, options, ["CPUExecutionProvider"])
    decoder = create_session(output_dir / DECODER_FILE, options, ["CPUExecutionProvider"])
    inplace = None
    if (output_dir / INPLACE_DECODER_FILE).is_file():
        inplace = create_session(output_dir / INPLACE_DECODER_FILE, options, ["CPUExecutionProvider"])
    kinds = ("encoder", "logits", "present") + (("inplace_logits", "inplace_present") if inplace else ())
    summary = {**dict.fromkeys(kinds, 0.0), "cases": []}
    for seed, case in enumerate(grid):
        # ids valid on both sides (the source and target vocabularies may differ in size)
        inputs = _case_inputs(case, min(config.vocab_size, config.target_vocab_size), seed)
        reference = _reference(model, inputs)
        actual = _run_onnx(encoder, decoder, config, inputs, reference)
        row = dict.fromkeys(kinds, 0.0)
        runs = [("", actual)] + ([("inplace_", _run_inplace(inplace, config, inputs, reference))] if inplace else [])
        for prefix, outputs in runs:
            for name, value in outputs.items():
                got = value.astype(np.float32)
                if not np.all(np.isfinite(got)):
                    raise ValueError(f"ONNX output {name!r} has non-finite values for {case}")
                diff = float(np.max(np.abs(got - reference[name]))) if got.size else 0.0
                kind = "logits" if name == LOGITS else "present" if is_self_attention(name) else "encoder"
                row[prefix + kind] = max(row[prefix + kind], diff)
        for kind in kinds:
            summary[kind] = max(summary[kind], row[kind])
        summary["cases"].append({**case.__dict__, **row})
    return summary


def validate_folder(
    model_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    tolerance: float = FP32_TOLERANCE,
    grid: list[GridCase] | None = None,
) -> dict:
    """Compare an export folder with the PyTorch model it came from; record the figures in its manifest.

    The fp32 graphs must stay within `tolerance` (a `ValueError` otherwise). For an fp16 or int8 folder the fp32
    graphs it was made from are rebuilt in a temporary folder and held to `tolerance`; the variant's own differences
    are reported, not bounded. Returns the manifest with `validation` (max abs differences per variant) and
    `validation_cases` (per grid case) added.
    """
    from ...inference import load_model_folder

    output_dir = Path(output_dir)
    manifest = read_manifest(output_dir)
    model = load_model_folder(Path(model_dir), dtype=torch.float32).eval()
    variant = "int8" if manifest["quantization"] else manifest["dtype"]
    report: dict = {}
    if variant == "fp32":
        report["fp32"] = validate_export(model, output_dir, grid)
    else:
        with tempfile.TemporaryDirectory(prefix="fp32-", dir=output_dir.parent) as fp32_dir:
            export_graphs(model, fp32_dir, opset=manifest["opset"])
            if (output_dir / INPLACE_DECODER_FILE).is_file():
                export_inplace_decoder(model, fp32_dir)
            report["fp32"] = validate_export(model, fp32_dir, grid)
    worst = max(value for key, value in report["fp32"].items() if key != "cases")
    if worst > tolerance:
        raise ValueError(f"fp32 export differs from PyTorch by {worst:.3g} > tolerance {tolerance:g}")
    if variant != "fp32":
        report[variant] = validate_export(model, output_dir, grid)
    manifest["validation"] = {k: {kk: vv for kk, vv in v.items() if kk != "cases"} for k, v in report.items()}
    manifest["validation_cases"] = {k: v["cases"] for k, v in report.items()}
    (output_dir / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
