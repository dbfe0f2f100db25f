"""Which kind of model folder a path is: this runtime's ONNX layout, the standard (optimum) ONNX layout, a PyTorch
model folder or a CTranslate2 folder; stdlib only, so the torch-free runtime can tell a user what they passed.

`detect_layout` looks only at file names (and manifest.json's `format`); `check_layout` turns a folder of the wrong
kind into one `ValueError` line that names what the folder is and the command that writes the expected kind.
"""

from __future__ import annotations

import os
from pathlib import Path

from .contract import CONFIG_FILE, DECODER_FILE, ENCODER_FILE, MANIFEST_FORMAT, read_manifest

VANILLA = "vanilla"  # this runtime's layout: encoder with cross K/V, one-step decoder, helper graphs, manifest.json
OPTIMUM = "optimum"  # the standard layout of 🤗 Optimum and transformers.js: onnx/decoder_model_merged.onnx
PYTORCH = "pytorch"  # a save_pretrained folder: config.json and PyTorch weights
CTRANSLATE2 = "ctranslate2"  # model.bin and config.json, no PyTorch weights
UNKNOWN = "unknown"
LAYOUTS = (VANILLA, OPTIMUM, PYTORCH, CTRANSLATE2)

# The standard layout's graphs live in an `onnx/` subfolder (transformers.js reads them there); optimum-cli writes
# the same files at the top of its output folder.
STANDARD_SUBFOLDER = "onnx"
STANDARD_ENCODER_FILE = "encoder_model.onnx"
STANDARD_DECODER_FILE = "decoder_model_merged.onnx"
TORCH_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                      "pytorch_model.bin.index.json")  # fmt: skip
CTRANSLATE2_MODEL_FILE = "model.bin"

DESCRIPTIONS = {
    VANILLA: "an ONNX export in this runtime's layout (manifest.json, encoder_model.onnx, decoder_model.onnx)",
    OPTIMUM: "an ONNX export in the standard layout of Optimum and transformers.js (onnx/decoder_model_merged.onnx)",
    PYTORCH: "a PyTorch model folder (config.json and model weights)",
    CTRANSLATE2: "a CTranslate2 model folder (model.bin)",
    UNKNOWN: "not a model folder this package recognises",
}
# The command that writes each layout from a PyTorch model folder (MODEL) into OUT.
COMMANDS = {
    VANILLA: "vt-export-onnx --model MODEL --output OUT",
    OPTIMUM: "vt-export-onnx --layout optimum --model MODEL --output OUT",
    CTRANSLATE2: "vt-export-ctranslate2 --model MODEL --output OUT",
}


def _manifest_format(folder: Path) -> str | None:
    try:
        return read_manifest(folder).get("format")
    except (OSError, ValueError):  # a damaged manifest: the folder is told by its file names
        return None


def detect_layout(folder: str | os.PathLike) -> str:
    """The kind of folder `folder` is: "vanilla", "optimum", "pytorch", "ctranslate2" or "unknown".

    The standard layout is told first, because a complete one also carries the PyTorch weights of its MarianMT
    model; a CTranslate2 folder holds `model.bin` and `config.json` but no PyTorch weights.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return UNKNOWN
    has = lambda *parts: folder.joinpath(*parts).is_file()  # noqa: E731
    if _manifest_format(folder) == MANIFEST_FORMAT:
        return VANILLA
    if has(CONFIG_FILE) and (has(STANDARD_SUBFOLDER, STANDARD_DECODER_FILE) or has(STANDARD_DECODER_FILE)):
        return OPTIMUM
    if has(ENCODER_FILE) and has(DECODER_FILE):  # no manifest says so (ExportFolder names what is missing)
        return VANILLA
    if has(CONFIG_FILE) and any(has(name) for name in TORCH_WEIGHT_FILES):
        return PYTORCH
    if has(CONFIG_FILE) and has(CTRANSLATE2_MODEL_FILE):
        return CTRANSLATE2
    return UNKNOWN


def layout_error(folder: str | os.PathLike, found: str, expected: str) -> str:
    """One line: what `folder` is, what was expected, and the command that writes the expected layout."""
    line = f"{folder} is {DESCRIPTIONS[found]}, not {DESCRIPTIONS[expected]}"
    if expected in COMMANDS:
        line += f"; write one with `{COMMANDS[expected]}`"
    return line


def check_layout(folder: str | os.PathLike, expected: str, *, refuse: tuple[str, ...] | None = None) -> str:
    """Raise ValueError (one line, see `layout_error`) when `folder` is a recognised layout other than `expected`;
    returns the detected layout. `refuse`: the layouts to refuse (default: every recognised one but `expected`), so a
    caller can leave folders it reports on itself (e.g. missing files) to its own checks."""
    if expected not in LAYOUTS:
        raise ValueError(f"expected must be one of {LAYOUTS}, got {expected!r}")
    found = detect_layout(folder)
    refused = tuple(name for name in LAYOUTS if name != expected) if refuse is None else refuse
    if found != expected and found in refused:
        raise ValueError(layout_error(folder, found, expected))
    return found
