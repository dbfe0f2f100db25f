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


QUANTIZE_LINEAR_BLOCKED_OPSET = 21  # QuantizeLinear's `block_size` (one scale per block of a row)


def _set_default_opset(model, version: int) -> None:
    """Raise the default-domain opset to at least `version` (opset 21 only widened the types of the operators this
    package's graphs use, and gave QuantizeLinear and DequantizeLinear blocks); IR version 10 goes with it."""
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version < version:
            opset.version = version
    model.ir_version = max(model.ir_version, 10)


def _keep_bias_out_of_the_fused_product(matmul, consumers: dict, initializers: dict, negated: dict) -> None:
    """Subtract the negated bias after a quantized product (MatMulInteger -> Cast -> Mul(scales) -> Add(bias)).

    onnxruntime fuses that chain into `MatMulIntegerToFloat` and takes a constant `Add` in as the kernel's bias; with
    a scale per row of A, 1.32's kernel then adds a wrong multiple of the bias to each row (measured; unfused, the
    same graph is right). `Sub(product, -bias)` is the same sum, exactly, and stays a node of its own; the product
    and its scales are still fused. `negated` collects the new initializers (name -> array).
    """
    from onnx import helper, numpy_helper

    for cast in consumers.get(matmul.output[0], []):
        for scaled in consumers.get(cast.output[0], []) if cast.op_type == "Cast" else []:
            for add in consumers.get(scaled.output[0], []) if scaled.op_type == "Mul" else []:
                if add.op_type != "Add" or scaled.output[0] not in add.input:
                    continue
                bias = next((name for name in add.input if name != scaled.output[0]), None)
                if bias not in initializers:
                    continue
                name = f"{bias}.negated"
                negated[name] = -numpy_helper.to_array(initializers[bias])
                sub = helper.make_node("Sub", [scaled.output[0], name], list(add.output), name=f"{add.output[0]}.bias")
                add.CopyFrom(sub)


def _check_one_row_shape(model, names: list[str]) -> None:
    """Raise if ONNX shape inference gives two of the tensors `names` different leading (row) dimensions; tensors
    whose shape it cannot tell (behind onnxruntime's contrib operators) are not compared."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # noqa: BLE001 - shape inference is a check here, not a requirement
        return
    infos = {v.name: v for v in [*inferred.value_info, *inferred.input, *inferred.output]}
    shapes: dict[tuple, str] = {}
    for name in names:
        info = infos.get(name)
        dims = info.type.tensor_type.shape.dim if info is not None and info.type.tensor_type.HasField("shape") else []
        # a dimension shape inference could not name is "unk__N", a fresh name each time: unknown, not compared
        rows = tuple(None if d.dim_param.startswith("unk__") else (d.dim_param or d.dim_value or None) for d in dims)
        rows = rows[:-1]
        if rows and all(rows):
            shapes.setdefault(rows, name)
    if len(shapes) > 1:
        raise ValueError(f"quantized products over rows of different shapes {sorted(shapes, key=str)}: "
                         "the per-row zero points cannot be shared")  # fmt: skip


def quantize_activations_per_row(path: Path) -> int:
    """Quantize every dynamically quantized activation with a scale per row (token) instead of one per tensor.

    `quantize_dynamic` quantizes a MatMul's input with `DynamicQuantizeLinear`: one scale and zero point for the
    whole tensor, so a row's result depends on the other rows of the batch (the range follows their values). Batched
    across requests, the same text could then get another translation. Each `DynamicQuantizeLinear` is replaced here
    by a quantization per row, symmetric as CTranslate2 quantizes its int8 inputs row by row:

        scale = max(|x_row|) / 127,  q = round(x / scale) + 128  in [1, 255], zero point 128

    and, where the input is a ReLU's output (never negative), all 256 levels on the row's range:
    scale = max(x_row) / 255, q = round(x / scale), zero point 0. The zero point is the same for every row, so it is
    `MatMulInteger`'s one per-tensor zero point and the product needs no correction; the quantization itself is one
    `QuantizeLinear` with a block the length of the row (opset 21, which the graph is raised to). The scale has shape
    (..., rows, 1) and broadcasts where the graph multiplies it by the weight's scale (onnxruntime still fuses that
    into `MatMulIntegerToFloat`). Every quantized product of a graph multiplies rows of one shape (the tokens of
    the batch; checked where ONNX shape inference knows the shapes), so the per-row zero points are made once per
    graph and kind (`Shape` and `ConstantOfShape`) and shared. 5 operators replace each quantizer (4 after a ReLU),
    and the product's bias is subtracted negated (`_keep_bias_out_of_the_fused_product`); returns how many
    quantizers were replaced.

    An earlier formulation (scale (max - min) / 254 per row, q = round((x - min) / scale), min x colsum(W) added
    back after the product) ran 11 operators, two of them over the product's (rows, N) output; the A/B is in
    docs/experiments/speed-log.md.
    """
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(path))
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    tiny = np.finfo(np.float32).tiny  # a row of zeros: scale tiny > 0, q = zero point
    constants = {
        "row_quant.axes": np.array([-1], np.int64),
        "row_quant.signed_levels": np.array(127.0, np.float32),
        "row_quant.signed_floor": np.array(127.0 * tiny, np.float32),
        "row_quant.signed_zero_point": np.array(128, np.uint8),
        "row_quant.unsigned_levels": np.array(255.0, np.float32),
        "row_quant.unsigned_floor": np.array(255.0 * tiny, np.float32),
        "row_quant.unsigned_zero_point": np.array(0, np.uint8),
    }
    _check_one_row_shape(model, [node.input[0] for node in graph.node if node.op_type == "DynamicQuantizeLinear"])
    replacements, negated_biases, replaced = {}, {}, 0  # nodes to insert in place of a quantizer; biases
    shared_zero_points: dict[str, str] = {}  # kind -> the graph's zero points of that kind, one per row
    for node in graph.node:
        if node.op_type != "DynamicQuantizeLinear":
            continue
        replaced += 1
        (x,), (q, scale, zero_point), p = node.input, node.output, f"row_quant{replaced}"
        matmuls = consumers.get(q, [])
        if any(m.op_type != "MatMulInteger" or m.input[2] != zero_point for m in matmuls):
            raise ValueError(f"{path}: {node.name} does not feed MatMulInteger with its zero point; not rewritten")
        widths = {int(numpy_helper.to_array(initializers[m.input[1]]).shape[0]) for m in matmuls}  # weights (K, N)
        if len(widths) != 1:
            raise ValueError(f"{path}: {node.name} feeds weights of widths {sorted(widths)}; not rewritten")
        unsigned = x in producers and producers[x].op_type == "Relu"
        kind = "unsigned" if unsigned else "signed"
        magnitude = x if unsigned else f"{p}.abs"  # a ReLU's output is its own magnitude
        nodes = [] if unsigned else [helper.make_node("Abs", [x], [magnitude])]
        nodes += [  # max(|x_row|), floored at levels x tiny: a row of zeros gets scale tiny
            helper.make_node("ReduceMax", [magnitude, "row_quant.axes"], [f"{p}.max"], keepdims=1),  # (..., rows, 1)
            helper.make_node("Max", [f"{p}.max", f"row_quant.{kind}_floor"], [f"{p}.range"]),
        ]
        nodes.append(helper.make_node("Div", [f"{p}.range", f"row_quant.{kind}_levels"], [scale]))
        zero_points = f"row_quant.{kind}_zero_points"
        if kind not in shared_zero_points:  # the first quantizer of its kind makes them for the graph
            zero_point_value = int(constants[f"row_quant.{kind}_zero_point"])
            nodes += [
                helper.make_node("Shape", [scale], [f"{p}.scale_shape"]),
                helper.make_node(  # QuantizeLinear's zero point has the scale's shape: one (equal) value per row
                    "ConstantOfShape",
                    [f"{p}.scale_shape"],
                    [zero_points],
                    value=helper.make_tensor("value", TensorProto.UINT8, [1], [zero_point_value]),
                ),
            ]
            shared_zero_points[kind] = zero_points
        nodes.append(  # round half to even, then the zero point, saturated to [0, 255]
            helper.make_node("QuantizeLinear", [x, scale, zero_points], [q], axis=-1, block_size=widths.pop())
        )
        replacements[id(node)] = nodes
        for matmul in matmuls:
            matmul.input[2] = f"row_quant.{kind}_zero_point"
            _keep_bias_out_of_the_fused_product(matmul, consumers, initializers, negated_biases)
    if replaced:
        nodes = []
        for node in graph.node:
            nodes += replacements.get(id(node), [node])
        del graph.node[:]
        graph.node.extend(nodes)
        used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
        orphaned = [init for init in graph.initializer if f"{init.name}.negated" in negated_biases]
        for init in orphaned:  # a bias now read only as its negation
            if init.name not in used:
                graph.initializer.remove(init)
        constants = {name: value for name, value in {**constants, **negated_biases}.items() if name in used}
        graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in constants.items())
        _set_default_opset(model, QUANTIZE_LINEAR_BLOCKED_OPSET)
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
