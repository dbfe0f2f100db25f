"""The standard-layout export (`vt-export-onnx --layout optimum`) of the tiny trained model of `onnx_helpers`, built
once per test process (fp32 and int8 graphs) and shared by the tests that read it."""

from __future__ import annotations

import functools
from pathlib import Path

from tests.onnx_helpers import _temporary_dir, trained_model_dir
from vanilla_transformer.export.onnx.standard_layout import export_standard_layout

STALE_FILE = "stale.txt"  # in the folder before the export, which replaces it (overwrite=True)


@functools.cache
def standard_export_dir() -> Path:
    """`export_standard_layout(trained_model_dir(), ..., quantize="int8", overwrite=True)` over a folder that held
    `STALE_FILE`: the fp32 and the `_quantized` graphs, config, generation config and tokenizer."""
    folder = _temporary_dir() / "standard"
    folder.mkdir()
    (folder / STALE_FILE).write_text("left by an earlier export")
    return export_standard_layout(trained_model_dir(), folder, quantize="int8", overwrite=True)
