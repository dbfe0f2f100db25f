"""fp16 and dynamic-int8 variants of the exported fp32 graphs, rewritten in place."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from transformers.utils import logging

from vanilla_transformer_ort.contract import DECODER_FILE, ENCODER_FILE, INPLACE_DECODER_FILE

logger = logging.get_logger(__name__)


def _shape_only_nodes(graph) -> list[str]:
    """Names of nodes whose values depend only on input *shapes* and constants (e.g. the sinusoid positions).

    They stay in fp32 under fp16 conversion: sin(pos * freq) with pos in the hundreds loses whole radians in fp16.
    """
    value_inputs = {i.name for i in graph.input}
    for node in graph.node:  # graph.node is topologically sorted
        if node.op_type in ("Shape", "Size"):
            continue
        if any(name in value_inputs for name in node.input):
            value_inputs.update(node.output)
    return [node.name for node in graph.node if not any(out in value_inputs for out in node.output)]


def convert_to_fp16(path: Path) -> None:
    """Rewrite an fp32 graph in fp16 in place; graph inputs and outputs (KV cache, logits) become fp16 too."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(path))
    for index, node in enumerate(model.graph.node):
        if not node.name:
            node.name = f"node_{index}"
    blocked = _shape_only_nodes(model.graph)
    converted = convert_float_to_float16(model, keep_io_types=False, node_block_list=blocked)
    onnx.save(converted, str(path))


def untie_output_projection(path: Path) -> bool:
    """Give the output projection its own pre-transposed (d_model, vocab) initializer.

    With a tied embedding the decoder computes `hidden @ Transpose(shared)`; int8 quantization of the shared table
    (needed for its Gather) would then dequantize all vocab x d_model weights on every step. Returns whether the
    output projection now has a weight of its own (rewritten here, or already folded by the exporter).
    """
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    logits_name = graph.output[0].name
    node = producers.get(logits_name)
    while node is not None and node.op_type in ("Add", "Identity", "Reshape"):  # a bias add or a reshape may follow
        node = next((producers[i] for i in node.input if i in producers), None)
    if node is None or node.op_type not in ("MatMul", "Gemm"):
        return False
    weight_input = node.input[1]
    consumers = [n for n in graph.node if weight_input in n.input]
    if weight_input in initializers and len(consumers) == 1:
        return True  # the exporter already folded the transpose into a weight of its own
    transpose = producers.get(weight_input)
    if node.op_type == "MatMul" and transpose is not None and transpose.op_type == "Transpose":
        source = transpose.input[0]
        if len(consumers) == 1:  # left in place, onnxruntime would still run it, dequantized, on every step
            graph.node.remove(transpose)
    elif node.op_type == "Gemm" and any(a.name == "transB" and a.i == 1 for a in node.attribute):
        source = weight_input
        node.attribute.remove(next(a for a in node.attribute if a.name == "transB"))
    else:
        return False
    if source not in initializers:
        return False
    weight = numpy_helper.to_array(initializers[source])  # (vocab, d_model)
    new_name = "lm_head.weight_transposed"
    graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(weight.T), new_name))
    node.input[1] = new_name
    onnx.save(model, str(path))
    return True


def quantize_int8(path: Path, contrib_ops: bool = False) -> None:
    """Dynamic int8 quantization of one graph, in place.

    Weights of the linear layers become int8 (activations are quantized per call); the embedding table is stored in
    int8 too and only the gathered rows are dequantized. Attention score products stay fp32 (no weight operand).
    `contrib_ops`: the graph holds onnxruntime contrib operators (the in-place decoder), whose output types ONNX's
    shape inference cannot tell; they are fp32.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    fp32_path = path.with_suffix(".fp32.onnx")
    path.rename(fp32_path)
    try:
        operators = ["MatMul", "Gemm", "Gather"]
        extra_options = {"DefaultTensorType": onnx.TensorProto.FLOAT} if contrib_ops else None
        quantize_dynamic(
            fp32_path, path, weight_type=QuantType.QInt8, op_types_to_quantize=operators, extra_options=extra_options
        )
    finally:
        fp32_path.unlink()
        for extra in path.parent.glob(f"{fp32_path.stem}*-inferred.onnx"):
            extra.unlink()


def _weight_column_sums(graph, matmul) -> np.ndarray:
    """Column sums of a `MatMulInteger`'s dequantized int8 weight: (N,) float32, scale x (sum_k w - K x zero point)."""
    from onnx import numpy_helper

    initializers = {init.name: init for init in graph.initializer}
    weight = numpy_helper.to_array(initializers[matmul.input[1]]).astype(np.int64)  # (K, N)
    zero_point = numpy_helper.to_array(initializers[matmul.input[3]]).astype(np.int64) if len(matmul.input) > 3 else 0
    scale = numpy_helper.to_array(initializers[matmul.input[1].removesuffix("_quantized") + "_scale"])
    return (scale.astype(np.float64) * (weight - zero_point).sum(axis=0)).astype(np.float32)


def quantize_activations_per_row(path: Path) -> int:
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


INT8_ACTIVATIONS = ("row", "tensor")  # one scale per row (token), batch-invariant; or one per tensor


def optimize_variant(
    output_dir: Path, dtype: str, quantize: str | None, inplace: bool = False, int8_activations: str = "row"
) -> None:
    """Turn the fp32 graphs in `output_dir` into the requested variant, in place; `inplace`: the folder has the
    in-place decoder graph too (fp32 only: its output projection is already a weight of its own);
    `int8_activations`: "row" quantizes each row of a MatMul's input with its own scale
    (`quantize_activations_per_row`), "tensor" leaves `quantize_dynamic`'s one scale per tensor."""
    if int8_activations not in INT8_ACTIVATIONS:
        raise ValueError(f"int8_activations must be one of {INT8_ACTIVATIONS}, got {int8_activations!r}")
    encoder_path, decoder_path = output_dir / ENCODER_FILE, output_dir / DECODER_FILE
    if dtype == "fp16":
        convert_to_fp16(encoder_path)
        convert_to_fp16(decoder_path)
    if quantize == "int8":
        if not untie_output_projection(decoder_path):
            logger.warning("Output projection pattern not found: the int8 decoder keeps the tied weight.")
        graphs = [(encoder_path, False), (decoder_path, False)]
        graphs += [(output_dir / INPLACE_DECODER_FILE, True)] if inplace else []
        for path, contrib_ops in graphs:
            quantize_int8(path, contrib_ops=contrib_ops)
            if int8_activations == "row":
                quantize_activations_per_row(path)
