"""The weightless helper graphs the runtime uses in beam search: cache reordering and candidate ranking.

Their names and I/O are part of `vanilla_transformer_ort.contract`; each follows the decoder graph's dtype.
"""

from __future__ import annotations

from pathlib import Path

from vanilla_transformer_ort.contract import (
    BEAM_SCORES_FILE,
    BEAM_SCORES_INPUTS,
    BEAM_SCORES_OUTPUTS,
    DECODER_FILE,
    LOGITS,
    REORDER_FILE,
    REORDER_INDEX,
    is_self_attention,
    reordered_name,
)


def write_cache_reorder_graph(output_dir: Path) -> Path:
    """A weightless helper graph that gathers self-attention cache rows (beam reordering) where the cache lives.

    Inputs: `beam_idx` (reordered_batch_size,) int64 and every `past_key_values.{i}.decoder.key/value`; outputs
    `reordered.{i}.decoder.key/value`. The runtime uses it with I/O binding so that beam search on CUDA never copies
    the cache to the host; its dtype follows the decoder graph's cache inputs (fp32 or fp16).
    """
    import onnx
    from onnx import TensorProto, helper

    decoder = onnx.load(str(output_dir / DECODER_FILE), load_external_data=False)
    cache_inputs = [value for value in decoder.graph.input if is_self_attention(value.name)]
    index = helper.make_tensor_value_info(REORDER_INDEX, TensorProto.INT64, ["reordered_batch_size"])
    inputs, outputs, nodes = [index], [], []
    for value in cache_inputs:
        dims = [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]  # (batch, heads, past, d_head)
        elem_type = value.type.tensor_type.elem_type
        name = reordered_name(value.name)
        inputs.append(helper.make_tensor_value_info(value.name, elem_type, dims))
        outputs.append(helper.make_tensor_value_info(name, elem_type, ["reordered_batch_size", *dims[1:]]))
        nodes.append(helper.make_node("Gather", [value.name, REORDER_INDEX], [name], axis=0))
    graph = helper.make_graph(nodes, "cache_reorder", inputs, outputs)
    model = helper.make_model(graph, opset_imports=list(decoder.opset_import), ir_version=decoder.ir_version)
    onnx.checker.check_model(model)
    path = output_dir / REORDER_FILE
    onnx.save(model, str(path))
    return path


def write_beam_scores_graph(output_dir: Path) -> Path:
    """A weightless helper graph for beam search: one step's candidate scores and their top k, on onnxruntime.

    Inputs: `logits` (rows, new_tokens, V) as the decoder returns them (fp32 or fp16), `running_scores` (rows, 1)
    float32, `bias` (V,) float32 (0, or -inf for tokens a logit processor bans), `scores_shape` (2,) int64 = [batch,
    -1] and `k` (1,) int64. Outputs `values` and `indices`, (batch, k): the k largest of
    `log_softmax(last logits) + bias + running_scores` over each sentence's num_beams x V candidates, in descending
    order, ties to the lower index (ONNX TopK): what transformers' beam search ranks. onnxruntime's vectorised,
    threaded kernels do this faster than numpy, and on CUDA only the top k leave the device.
    """
    import onnx
    from onnx import TensorProto, helper

    decoder = onnx.load(str(output_dir / DECODER_FILE), load_external_data=False)
    logits_type = next(o for o in decoder.graph.output if o.name == LOGITS).type.tensor_type.elem_type
    logits, running_scores, bias, scores_shape, k = BEAM_SCORES_INPUTS
    values, indices = BEAM_SCORES_OUTPUTS
    nodes = [helper.make_node("Gather", [logits, "last_position"], ["last_logits"], axis=1)]  # (rows, V)
    if logits_type != TensorProto.FLOAT:
        nodes.append(helper.make_node("Cast", ["last_logits"], ["last_logits_fp32"], to=TensorProto.FLOAT))
    nodes += [
        helper.make_node("LogSoftmax", [nodes[-1].output[0]], ["log_probs"], axis=-1),
        helper.make_node("Add", ["log_probs", bias], ["processed"]),
        helper.make_node("Add", ["processed", running_scores], ["scores"]),
        helper.make_node("Reshape", ["scores", scores_shape], ["sentence_scores"]),  # (batch, num_beams * V)
        helper.make_node("TopK", ["sentence_scores", k], [values, indices], axis=-1, largest=1, sorted=1),
    ]
    graph = helper.make_graph(
        nodes,
        "beam_scores",
        [
            helper.make_tensor_value_info(logits, logits_type, ["rows", "new_tokens", "vocab"]),
            helper.make_tensor_value_info(running_scores, TensorProto.FLOAT, ["rows", 1]),
            helper.make_tensor_value_info(bias, TensorProto.FLOAT, ["vocab"]),
            helper.make_tensor_value_info(scores_shape, TensorProto.INT64, [2]),
            helper.make_tensor_value_info(k, TensorProto.INT64, [1]),
        ],
        [
            helper.make_tensor_value_info(values, TensorProto.FLOAT, ["batch", "k"]),
            helper.make_tensor_value_info(indices, TensorProto.INT64, ["batch", "k"]),
        ],
        [helper.make_tensor("last_position", TensorProto.INT64, [], [-1])],
    )
    model = helper.make_model(graph, opset_imports=list(decoder.opset_import), ir_version=decoder.ir_version)
    onnx.checker.check_model(model)
    path = output_dir / BEAM_SCORES_FILE
    onnx.save(model, str(path))
    return path
