"""The previous per-row int8 formulation, kept to measure the current one against it (benchmarks/README.md, item 20).

Until 4 Dec 2026 `vt-export-onnx --int8_activations row` quantized each row asymmetrically: scale (max - min) / 254,
q = round((x - min) / scale) with zero point 0, and min x colsum(W) added back after each product (11 operators per
quantized product, two of them over the product's (rows, N) output). `offset_rows_export` rebuilds such a folder from
the per-tensor export of the same model (the same `quantize_dynamic` graphs, before any per-row rewrite).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np


def _weight_column_sums(graph, matmul) -> np.ndarray:
    """Column sums of a `MatMulInteger`'s dequantized int8 weight: (N,) float32, scale x (sum_k w - K x zero point)."""
    from onnx import numpy_helper

    initializers = {init.name: init for init in graph.initializer}
    weight = numpy_helper.to_array(initializers[matmul.input[1]]).astype(np.int64)  # (K, N)
    zero_point = numpy_helper.to_array(initializers[matmul.input[3]]).astype(np.int64) if len(matmul.input) > 3 else 0
    scale = numpy_helper.to_array(initializers[matmul.input[1].removesuffix("_quantized") + "_scale"])
    return (scale.astype(np.float64) * (weight - zero_point).sum(axis=0)).astype(np.float32)


def quantize_activations_offset_rows(path: Path) -> int:
    """Quantize every dynamically quantized activation with a range per row (token) instead of one per tensor.

    `quantize_dynamic` quantizes a MatMul's input with `DynamicQuantizeLinear`: one scale and zero point for the
    whole tensor, so a row's result depends on the other rows of the batch (the range follows their values). Batched
    across requests, the same text could then get another translation. Each `DynamicQuantizeLinear` is replaced here
    by a per-row quantization, as CTranslate2 quantizes its int8 inputs row by row:

        scale = (max(x_row) - min(x_row)) / 254,  q = round((x - min(x_row)) / scale)  in [0, 254]

    onnxruntime's `MatMulInteger` takes one zero point per tensor, so the row's offset is not a zero point (q is
    taken with zero point 0): the product of the shifted rows, (x - min) W, gets min * colsum(W) added back, with
    colsum(W) of the dequantized weight computed at export. Like `DynamicQuantizeLinear`'s asymmetric range, this
    spends all levels on the row's own range (ReLU outputs included). The scale has shape (..., rows, 1) and
    broadcasts where the graph multiplies it by the weight's scale (onnxruntime still fuses that into
    `MatMulIntegerToFloat`). 11 operators replace each quantizer (9) and follow each product (2); returns the
    number of quantizations replaced.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    constants = {
        "row_quant.axes": np.array([-1], np.int64),
        "row_quant.levels": np.array(254.0, np.float32),
        "row_quant.tiny": np.array(np.finfo(np.float32).tiny, np.float32),  # a constant row: scale > 0, q = 0
        "row_quant.zero_point": np.array(0, np.uint8),
    }
    before, after, replaced = {}, {}, 0  # nodes to insert in place of a quantizer / after a product's scaling
    for node in graph.node:
        if node.op_type != "DynamicQuantizeLinear":
            continue
        replaced += 1
        (x,), (q, scale, zero_point), p = node.input, node.output, f"row_quant{replaced}"
        before[id(node)] = [
            helper.make_node("ReduceMax", [x, "row_quant.axes"], [f"{p}.max"], keepdims=1),  # (..., rows, 1)
            helper.make_node("ReduceMin", [x, "row_quant.axes"], [f"{p}.min"], keepdims=1),
            helper.make_node("Sub", [f"{p}.max", f"{p}.min"], [f"{p}.range"]),
            helper.make_node("Div", [f"{p}.range", "row_quant.levels"], [f"{p}.scale"]),
            helper.make_node("Max", [f"{p}.scale", "row_quant.tiny"], [scale]),
            helper.make_node("Sub", [x, f"{p}.min"], [f"{p}.shifted"]),
            helper.make_node("Div", [f"{p}.shifted", scale], [f"{p}.scaled"]),
            helper.make_node("Round", [f"{p}.scaled"], [f"{p}.rounded"]),  # half to even, as DynamicQuantizeLinear
            helper.make_node("Cast", [f"{p}.rounded"], [q], to=TensorProto.UINT8),
        ]
        for matmul in consumers[q]:  # MatMulInteger -> Cast -> Mul(scale product): the product's float value
            if matmul.input[2] != zero_point:
                raise ValueError(f"{path}: {matmul.name} does not take the quantizer's zero point; not rewritten")
            matmul.input[2] = "row_quant.zero_point"
            (cast,) = consumers[matmul.output[0]]
            (scaled,) = consumers[cast.output[0]]
            sums = f"{p}.{matmul.name}.weight_column_sums"
            constants[sums] = _weight_column_sums(graph, matmul)
            product = scaled.output[0]
            scaled.output[0] = f"{product}.shifted"
            after[id(scaled)] = [
                helper.make_node("Mul", [f"{p}.min", sums], [f"{p}.{matmul.name}.offset"]),  # min x colsum(W)
                helper.make_node("Add", [f"{product}.shifted", f"{p}.{matmul.name}.offset"], [product]),
            ]
    if replaced:
        nodes = []
        for node in graph.node:
            nodes += before.get(id(node), [node]) + after.get(id(node), [])
        del graph.node[:]
        graph.node.extend(nodes)
        graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in constants.items())
        onnx.save(model, str(path))
    return replaced


def offset_rows_export(per_tensor: Path, output: Path) -> Path:
    """A copy of the per-tensor int8 folder `per_tensor` with every quantizer rewritten the previous per-row way."""
    from vanilla_transformer_ort.contract import DECODER_FILE, ENCODER_FILE, INPLACE_DECODER_FILE, MANIFEST_FILE

    if (output / MANIFEST_FILE).exists():
        return output
    shutil.rmtree(output, ignore_errors=True)
    shutil.copytree(per_tensor, output)
    (output / MANIFEST_FILE).unlink()  # written last, once the graphs are rewritten
    for name in (ENCODER_FILE, DECODER_FILE, INPLACE_DECODER_FILE):
        if (output / name).exists():
            quantize_activations_offset_rows(output / name)
    manifest = json.loads((per_tensor / MANIFEST_FILE).read_text())
    manifest["quantization"] = "int8-dynamic-per-row"
    (output / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))
    return output
