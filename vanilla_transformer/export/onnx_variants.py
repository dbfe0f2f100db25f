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


def quantize_activations_per_row(path: Path) -> int:
    """Quantize every dynamically quantized activation with one scale per row (token) instead of one per tensor.

    `quantize_dynamic` quantizes a MatMul's input with `DynamicQuantizeLinear`: one scale and zero point for the
    whole tensor, so a row's result depends on the other rows of the batch (its scale follows their largest value).
    Batched across requests, the same text could then get another translation. Each `DynamicQuantizeLinear` is
    replaced here by symmetric per-row quantization, as CTranslate2 quantizes its int8 inputs:
    scale = max(|x_row|) / 127, q = round(x / scale) + 128 (uint8, zero point 128), so a row's values never depend
    on another row's. The scale has shape (..., rows, 1) and broadcasts where the graph multiplies it by the weight's
    scale; onnxruntime fuses the product into `MatMulIntegerToFloat` as before. Returns the number replaced.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    constants = {
        "row_quant.axes": np.array([-1], np.int64),
        "row_quant.levels": np.array(127.0, np.float32),
        "row_quant.tiny": np.array(np.finfo(np.float32).tiny, np.float32),  # an all-zero row: scale > 0, q = 128
        "row_quant.offset": np.array(128.0, np.float32),
        "row_quant.zero_point": np.array(128, np.uint8),
    }
    nodes, replaced = [], 0
    for node in graph.node:
        if node.op_type != "DynamicQuantizeLinear":
            nodes.append(node)
            continue
        replaced += 1
        (x,), (q, scale, zero_point), p = node.input, node.output, f"{node.name or 'dql'}.row_quant{replaced}"
        nodes += [
            helper.make_node("Abs", [x], [f"{p}.abs"]),
            helper.make_node("ReduceMax", [f"{p}.abs", "row_quant.axes"], [f"{p}.max"], keepdims=1),  # (..., rows, 1)
            helper.make_node("Div", [f"{p}.max", "row_quant.levels"], [f"{p}.scale"]),
            helper.make_node("Max", [f"{p}.scale", "row_quant.tiny"], [scale]),
            helper.make_node("Div", [x, scale], [f"{p}.scaled"]),
            helper.make_node("Round", [f"{p}.scaled"], [f"{p}.rounded"]),  # half to even, as DynamicQuantizeLinear
            helper.make_node("Add", [f"{p}.rounded", "row_quant.offset"], [f"{p}.shifted"]),  # in [1, 255]
            helper.make_node("Cast", [f"{p}.shifted"], [q], to=TensorProto.UINT8),
            helper.make_node("Identity", ["row_quant.zero_point"], [zero_point]),
        ]
    if replaced:
        del graph.node[:]
        graph.node.extend(nodes)
        graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in constants.items())
        onnx.save(model, str(path))
    return replaced


def optimize_variant(output_dir: Path, dtype: str, quantize: str | None, inplace: bool = False) -> None:
    """Turn the fp32 graphs in `output_dir` into the requested variant, in place; `inplace`: the folder has the
    in-place decoder graph too (fp32 only: its output projection is already a weight of its own)."""
    encoder_path, decoder_path = output_dir / ENCODER_FILE, output_dir / DECODER_FILE
    if dtype == "fp16":
        convert_to_fp16(encoder_path)
        convert_to_fp16(decoder_path)
    if quantize == "int8":
        if not untie_output_projection(decoder_path):
            logger.warning("Output projection pattern not found: the int8 decoder keeps the tied weight.")
        quantize_int8(encoder_path)
        quantize_int8(decoder_path)
        if inplace:
            quantize_int8(output_dir / INPLACE_DECODER_FILE, contrib_ops=True)
