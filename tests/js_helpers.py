"""Shared by the transformers.js checks (Node and browser): the exports they run, this package's own translations
of the same sentences, and the pinned transformers.js installation.

One model that really copies (`onnx_helpers.copying_model_dir`) is exported three ways: the standard layout with its
int8 graphs (what transformers.js reads), and this package's own layout in fp32 and in int8 (what
`vanilla_transformer_ort` reads; int8 with per-tensor activation scales, the quantization of the standard layout's
int8 graphs). Exporting takes most of the checks' time, so the folders are kept in
`${XDG_CACHE_HOME:-~/.cache}/vanilla-transformer/transformers-js-exports/<key>/`, where the key hashes every source
file of `vanilla_transformer` and of the runtime (its server aside), tests/onnx_helpers.py, this file and the
versions of the libraries that train and export: any change to the code under test exports afresh (delete the
folder to force it). The translations of our runtime are computed on every run.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "js"))
import npm_cache  # noqa: E402  (tests/js/npm_cache.py, standard library only; the browser example uses it too)

# Sentences over the copy model's vocabulary (single lowercase letters and digits): plain copies, repetitions,
# ten-word sentences that max_new_tokens cuts, and unknown words (<unk>), where the model guesses: those outputs
# hang on small logit differences (zeroing one decoder weight matrix changes three of them).
SENTENCES = [
    "a b c d",
    "q r s t u v w x y",
    "m n",
    "z",
    "6 5 4 3 2 1 0",
    "0 0 1 1 0 0 1 1 0",
    "h e l l o w o r l d",
    "b a b a b a b a b a",
    "Hello world",
    "the quick fox",
    "hello a b c",
    "a 7 b 8 c 9",
    "a b Hello c d",
    "x Y z",
]
# Greedy on both sides; 10 new tokens (EOS included) stays within the copy model's 12 positions.
MAX_NEW_TOKENS = 10
# transformers.js's name for the graphs -> the folder of this package's layout that computes the same thing: fp32,
# and for q8 int8 with one activation scale per tensor, as `quantize_dynamic` writes the standard layout's
# `_quantized` graphs (the default one scale per row is another quantization: where the copy model's logits are
# close, the two may pick different tokens).
OWN_EXPORT_OF = {"fp32": "own-fp32", "q8": "own-int8-tensor"}
EXPORT_LIBRARIES = ("torch", "transformers", "tokenizers", "onnx", "onnxscript", "onnxruntime", "numpy")
CACHE_NAME = "transformers-js-exports"
STALE_AFTER_S = 24 * 3600


def installed_transformers_js() -> Path:
    """The pinned transformers.js installation (npm ci once); skips the test only when npm cannot reach its
    registry, and fails on any other problem."""
    try:
        return npm_cache.ensure_installed()
    except npm_cache.RegistryUnreachable as error:
        pytest.skip(f"transformers.js is not installed and the npm registry cannot be reached: {error}"[:500])


def _sources_key() -> str:
    digest = hashlib.sha256()
    files = [ROOT / "tests" / "onnx_helpers.py", Path(__file__)]
    files += sorted((ROOT / "vanilla_transformer").rglob("*.py"))
    files += sorted((ROOT / "runtime" / "vanilla_transformer_ort").glob("*.py"))  # not serve/: no exporter uses it
    for path in files:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    for name in EXPORT_LIBRARIES:
        digest.update(f"{name}={importlib.metadata.version(name)}\0".encode())
    digest.update(f"{sys.version}\0{platform.machine()}".encode())
    return digest.hexdigest()[:16]


def _export_all(folder: Path) -> None:
    from tests.onnx_helpers import copying_model_dir
    from vanilla_transformer.export.onnx.export import export_model
    from vanilla_transformer.export.onnx.standard_layout import export_standard_layout

    model_dir = copying_model_dir()
    export_standard_layout(model_dir, folder / "standard", quantize="int8")
    export_model(model_dir, folder / OWN_EXPORT_OF["fp32"])
    export_model(model_dir, folder / OWN_EXPORT_OF["q8"], quantize="int8", int8_activations="tensor")


@functools.cache
def export_dirs() -> Path:
    """Folder with `standard/` (standard layout, fp32 and int8 graphs), `own-fp32/` and `own-int8/`."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vanilla-transformer" / CACHE_NAME
    target = root / _sources_key()
    if not (target / "complete").is_file():
        root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
        try:
            _export_all(staging)
            (staging / "complete").write_text("")
            for stale in root.iterdir():  # exports of other sources, untouched for a day
                if stale.name != target.name and time.time() - stale.stat().st_mtime > STALE_AFTER_S:
                    shutil.rmtree(stale, ignore_errors=True)
            try:
                os.rename(staging, target)
            except OSError:  # another run finished first
                if not (target / "complete").is_file():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    os.utime(target)  # in use: not stale
    return target


def standard_export_dir() -> Path:
    return export_dirs() / "standard"


@functools.cache
def reference_translations(dtype: str) -> tuple[str, ...]:
    """`SENTENCES` translated by `vanilla_transformer_ort` from our own export of the precision of transformers.js's
    `dtype` ("fp32" or "q8"), one sentence at a time, greedy, `MAX_NEW_TOKENS`."""
    from vanilla_transformer_ort.translator import OrtTranslator

    translator = OrtTranslator(export_dirs() / OWN_EXPORT_OF[dtype])
    return tuple(
        translator.translate([sentence], num_beams=1, max_new_tokens=MAX_NEW_TOKENS)[0] for sentence in SENTENCES
    )
