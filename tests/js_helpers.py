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
EXACT_Q8 = "own-int8-tensor-exact"  # the q8 one with exact integer products, as the browser computes them
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
    exact_int8_copy(folder / OWN_EXPORT_OF["q8"], folder / EXACT_Q8)


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


def exact_int8_copy(folder: Path, output: Path) -> Path:
    """A copy of the int8 export `folder` whose int8 weights (and their zero points) are stored as uint8, 128 higher:
    every `MatMulInteger` multiplies the same integers, but through onnxruntime's u8 x u8 kernel, which is exact on
    every x86 CPU. Its u8 x s8 kernel on CPUs without VNNI (AVX2 only: `vpmaddubsw`) adds two products at a time in
    16 bits and saturates, while onnxruntime's WebAssembly build, in the browser, computes the products exactly."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    shutil.copytree(folder, output)
    for path in sorted(output.glob("*.onnx")):
        model = onnx.load(str(folder / path.name))  # with its external data
        initializers = {tensor.name: tensor for tensor in model.graph.initializer}
        shifted: dict[str, str] = {}
        for node in model.graph.node:
            if node.op_type != "MatMulInteger":
                continue
            for index in (1, 3):  # the weight and its zero point
                name = node.input[index]
                if initializers[name].data_type != onnx.TensorProto.INT8:
                    raise ValueError(f"{path.name}: {node.name} input {index} is not an int8 constant")
                if name not in shifted:
                    values = numpy_helper.to_array(initializers[name]).astype(np.int16) + 128
                    shifted[name] = f"{name}_as_uint8"
                    model.graph.initializer.append(numpy_helper.from_array(values.astype(np.uint8), shifted[name]))
                node.input[index] = shifted[name]
        used = {name for node in model.graph.node for name in node.input}
        kept = [tensor for tensor in model.graph.initializer if tensor.name in used]
        del model.graph.initializer[:]
        model.graph.initializer.extend(kept)
        onnx.save(model, str(path))
    return output


def matmul_integer_model(rows: int, b):
    """A graph of one `MatMulInteger`: uint8 input `a` of `rows` rows times the int8 constant `b` (zero point 0),
    int32 output `c`."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    depth, columns = b.shape
    node = helper.make_node("MatMulInteger", ["a", "b", "", "b_zero"], ["c"])
    graph = helper.make_graph(
        [node], "product", [helper.make_tensor_value_info("a", TensorProto.UINT8, [rows, depth])],
        [helper.make_tensor_value_info("c", TensorProto.INT32, [rows, columns])],
        [numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.zeros(columns, np.int8), "b_zero")],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def native_int8_is_exact() -> bool:
    """Whether onnxruntime's u8 x s8 product is exact on this CPU (a product whose pairs overflow 16 bits)."""
    import numpy as np
    import onnxruntime as ort

    model = matmul_integer_model(1, np.full((2, 1), 127, np.int8))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return int(session.run(None, {"a": np.full((1, 2), 255, np.uint8)})[0][0, 0]) == 2 * 255 * 127


@functools.cache
def reference_translations(dtype: str, exact_int8: bool = False) -> tuple[str, ...]:
    """`SENTENCES` translated by `vanilla_transformer_ort` from our own export of the precision of transformers.js's
    `dtype` ("fp32" or "q8"), one sentence at a time, greedy, `MAX_NEW_TOKENS`. `exact_int8`: q8's integer
    products computed exactly, as the browser computes them (`exact_int8_copy`), whatever this CPU's kernel does."""
    from vanilla_transformer_ort.translator import OrtTranslator

    translator = OrtTranslator(export_dirs() / (EXACT_Q8 if exact_int8 and dtype == "q8" else OWN_EXPORT_OF[dtype]))
    return tuple(
        translator.translate([sentence], num_beams=1, max_new_tokens=MAX_NEW_TOKENS)[0] for sentence in SENTENCES
    )
