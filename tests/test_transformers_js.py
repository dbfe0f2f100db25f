"""transformers.js in Node on the standard ONNX layout translates like this package's own runtime.

The oracle is the ecosystem's code: transformers.js (pinned in tests/js/package-lock.json) runs
`pipeline("translation")` with onnxruntime-node on `export_standard_layout`'s folder, and `vanilla_transformer_ort`
runs `export_model`'s folder of the same model; greedy, the same max_new_tokens, one sentence at a time. fp32 graphs
are compared with our fp32 export, transformers.js's q8 (`*_quantized.onnx`) with our int8 export that quantizes
activations per tensor as they do (onnxruntime-node runs the same native kernels as our runtime; the browser's
WebAssembly build does not: tests/test_browser_example.py). Fixtures: tests/js_helpers.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.js_helpers import (
    MAX_NEW_TOKENS,
    SENTENCES,
    exact_int8_copy,
    installed_transformers_js,
    matmul_integer_model,
    npm_cache,
    reference_translations,
    standard_export_dir,
)

NODE_TIMEOUT_S = 300


def run_translate_mjs(model_dir, dtype: str) -> list[str]:
    """tests/js/translate.mjs on `SENTENCES`: transformers.js's translations, in order."""
    node = shutil.which("node")
    assert node, "Node.js is not installed (transformers.js runs on it); install Node.js 20+"
    script = npm_cache.runnable_script(installed_transformers_js(), "translate.mjs")
    result = subprocess.run(
        [node, str(script), str(model_dir), "--dtype", dtype, "--max_new_tokens", str(MAX_NEW_TOKENS)],
        input="\n".join(SENTENCES) + "\n", capture_output=True, text=True, timeout=NODE_TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def test_reference_translations_are_not_only_copies():
    """The copy model's guesses for unknown words make the comparisons depend on its logits, not only on copying."""
    references = reference_translations("fp32")
    assert len(references) == len(SENTENCES) >= 8
    assert all(references), references
    assert sum(ref != source for ref, source in zip(references, SENTENCES, strict=True)) >= 3, references


def test_the_exact_int8_copy_computes_the_integer_products_exactly(tmp_path):
    """The browser's reference (`exact_int8_copy`) multiplies the same integers, exactly, on any CPU: uint8 inputs
    and int8 weights whose pairs of products overflow 16 bits, against numpy's int64 product."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (5, 64), dtype=np.uint8)
    b = rng.integers(-127, 128, (64, 7), dtype=np.int8)
    b[:, 0], a[0] = 127, 255  # one column and one row that saturate a 16-bit sum of two products
    (tmp_path / "int8").mkdir()
    onnx.save(matmul_integer_model(5, b), tmp_path / "int8" / "product.onnx")
    copy = exact_int8_copy(tmp_path / "int8", tmp_path / "exact")
    session = ort.InferenceSession(str(copy / "product.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {"a": a})[0], a.astype(np.int64) @ b.astype(np.int64))


@pytest.mark.parametrize("dtype", ["fp32", "q8"])
def test_node_translates_like_our_runtime(dtype):
    translations = run_translate_mjs(standard_export_dir(), dtype)
    assert translations == list(reference_translations(dtype))


def test_translate_mjs_refuses_a_bad_dtype():
    node = shutil.which("node")
    assert node, "Node.js is not installed"
    script = npm_cache.runnable_script(installed_transformers_js(), "translate.mjs")
    result = subprocess.run([node, str(script), "model", "--dtype", "fp64"], input="", capture_output=True, text=True)
    assert result.returncode == 2
    assert "--dtype must be one of fp32, q8" in result.stderr
