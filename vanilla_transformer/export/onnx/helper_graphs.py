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


# Block size of the beam-scores graph's two-stage top k (`beam_scores_block_size`): the divisor of the vocabulary
# closest to this, the fastest of the block sizes measured (docs/experiments/speed-log.md).
PREFERRED_SCORE_BLOCK = 64


def beam_scores_block_size(vocab_size: int | None) -> int | None:
    """The block size of the two-stage top k for a vocabulary: the divisor of `vocab_size` in [16, 256] closest to
    `PREFERRED_SCORE_BLOCK` (the smaller on a tie) that leaves at least 4 blocks a row; None (one `TopK` over every
    candidate) when there is none or the vocabulary size is unknown."""
    if not vocab_size:
        return None
    sizes = [b for b in range(16, 257) if vocab_size % b == 0 and vocab_size // b >= 4]
    return min(sizes, key=lambda b: (abs(b - PREFERRED_SCORE_BLOCK), b)) if sizes else None


def beam_scores_model(logits_type: int, vocab_size: int | None, opset_imports, ir_version: int, block_size=None):
    """The `beam_scores.onnx` model (see `write_beam_scores_graph`); `block_size=None` ranks with one `TopK` over all
    num_beams x V candidates of a sentence, an int `B` (a divisor of `vocab_size`) with the two-stage top k."""
    from onnx import TensorProto, helper

    logits, running_scores, bias, scores_shape, k = BEAM_SCORES_INPUTS
    values, indices = BEAM_SCORES_OUTPUTS
    node = helper.make_node
    ints = lambda name, vals: helper.make_tensor(name, TensorProto.INT64, [len(vals)], vals)  # noqa: E731
    nodes = [node("Gather", [logits, "last_position"], ["last_logits"], axis=1)]  # (rows, V)
    if logits_type != TensorProto.FLOAT:
        nodes.append(node("Cast", ["last_logits"], ["last_logits_fp32"], to=TensorProto.FLOAT))
    nodes += [
        node("LogSoftmax", [nodes[-1].output[0]], ["log_probs"], axis=-1),
        node("Add", ["log_probs", bias], ["processed"]),  # (rows, V)
    ]
    initializers = [helper.make_tensor("last_position", TensorProto.INT64, [], [-1])]
    if block_size is None:
        nodes += [
            node("Add", ["processed", running_scores], ["scores"]),
            node("Reshape", ["scores", scores_shape], ["sentence_scores"]),  # (batch, num_beams * V)
            node("TopK", ["sentence_scores", k], [values, indices], axis=-1, largest=1, sorted=1),
        ]
    else:
        if vocab_size is None or vocab_size % block_size or vocab_size // block_size < 2:
            raise ValueError(f"block_size {block_size} must divide the vocabulary ({vocab_size}) at least twice")
        num_blocks = vocab_size // block_size
        opset = next((o.version for o in opset_imports if o.domain in ("", "ai.onnx")), 17)
        reduce_max = (  # ReduceMax takes its axes as an input from opset 18 on
            node("ReduceMax", ["blocks", "last_axis"], ["block_max"], keepdims=0)
            if opset >= 18
            else node("ReduceMax", ["blocks"], ["block_max"], axes=[-1], keepdims=0)
        )
        # Stage 1: each block's best candidate. Adding a row's running score commutes with the maximum (rounding is
        # monotonic), so these are exactly the block maxima of processed + running_scores.
        nodes += [
            node("Reshape", ["processed", "rows_blocks_block"], ["blocks"]),  # (rows, V / B, B)
            reduce_max,  # (rows, V / B)
            node("Add", ["block_max", running_scores], ["block_scores"]),
            node("Reshape", ["block_scores", scores_shape], ["sentence_blocks"]),  # (batch, num_beams * V / B)
            # The k best candidates lie in the k blocks with the best maxima (ties to the lower block, as TopK does):
            # each block ranked before a candidate's own holds a candidate ranked before it.
            node("TopK", ["sentence_blocks", k], ["_block_values", "top_blocks"], axis=-1, largest=1, sorted=1),
            # ... taken in ascending order, so that a candidate's place among them follows its index (TopK's ties).
            node("Neg", ["top_blocks"], ["negated_blocks"]),
            node("TopK", ["negated_blocks", k], ["negated_sorted", "_order"], axis=-1, largest=1, sorted=1),
            node("Neg", ["negated_sorted"], ["chosen_blocks"]),  # (batch, k), ascending
            # Stage 2: the chosen blocks' candidates, with the same two additions as the one-stage graph.
            node("Reshape", ["processed", scores_shape], ["sentence_processed"]),  # (batch, num_beams * V)
            node("Reshape", ["sentence_processed", "batch_blocks_block"], ["sentence_block_rows"]),  # (batch, nV/B, B)
            node("Unsqueeze", ["chosen_blocks", "last_axis"], ["chosen_column"]),  # (batch, k, 1)
            node("Add", ["chosen_column", "block_zeros"], ["gather_index"]),  # (batch, k, B)
            node("GatherElements", ["sentence_block_rows", "gather_index"], ["chosen_processed"], axis=1),
            node("Reshape", [running_scores, scores_shape], ["sentence_running"]),  # (batch, num_beams)
            node("Div", ["chosen_blocks", "blocks_per_row"], ["chosen_beams"]),  # (batch, k)
            node("GatherElements", ["sentence_running", "chosen_beams"], ["chosen_running"], axis=1),
            node("Unsqueeze", ["chosen_running", "last_axis"], ["chosen_running_column"]),  # (batch, k, 1)
            node("Add", ["chosen_processed", "chosen_running_column"], ["chosen_scores"]),  # (batch, k, B)
            node("Reshape", ["chosen_scores", "batch_flat"], ["candidates"]),  # (batch, k * B)
            node("TopK", ["candidates", k], [values, "positions"], axis=-1, largest=1, sorted=1),
            node("Div", ["positions", "block"], ["position_block"]),
            node("Mod", ["positions", "block"], ["position_offset"]),
            node("GatherElements", ["chosen_blocks", "position_block"], ["source_block"], axis=1),
            node("Mul", ["source_block", "block"], ["block_start"]),
            node("Add", ["block_start", "position_offset"], [indices]),  # index into num_beams * V
        ]
        initializers += [
            ints("rows_blocks_block", [0, num_blocks, block_size]),
            ints("batch_blocks_block", [0, -1, block_size]),
            ints("batch_flat", [0, -1]),
            ints("last_axis", [-1]),
            helper.make_tensor("block_zeros", TensorProto.INT64, [1, 1, block_size], [0] * block_size),
            helper.make_tensor("blocks_per_row", TensorProto.INT64, [], [num_blocks]),
            helper.make_tensor("block", TensorProto.INT64, [], [block_size]),
        ]
    vocab_dim = vocab_size if block_size is not None else "vocab"
    graph = helper.make_graph(
        nodes,
        "beam_scores",
        [
            helper.make_tensor_value_info(logits, logits_type, ["rows", "new_tokens", vocab_dim]),
            helper.make_tensor_value_info(running_scores, TensorProto.FLOAT, ["rows", 1]),
            helper.make_tensor_value_info(bias, TensorProto.FLOAT, [vocab_dim]),
            helper.make_tensor_value_info(scores_shape, TensorProto.INT64, [2]),
            helper.make_tensor_value_info(k, TensorProto.INT64, [1]),
        ],
        [
            helper.make_tensor_value_info(values, TensorProto.FLOAT, ["batch", "k"]),
            helper.make_tensor_value_info(indices, TensorProto.INT64, ["batch", "k"]),
        ],
        initializers,
    )
    return helper.make_model(graph, opset_imports=list(opset_imports), ir_version=ir_version)


def write_beam_scores_graph(output_dir: Path, block_size: int | None | str = "auto") -> Path:
    """A weightless helper graph for beam search: one step's candidate scores and their top k, on onnxruntime.

    Inputs: `logits` (rows, new_tokens, V) as the decoder returns them (fp32 or fp16), `running_scores` (rows, 1)
    float32, `bias` (V,) float32 (0, or -inf for tokens a logit processor bans), `scores_shape` (2,) int64 = [batch,
    -1] and `k` (1,) int64. Outputs `values` and `indices`, (batch, k): the k largest of
    `log_softmax(last logits) + bias + running_scores` over each sentence's num_beams x V candidates, in descending
    order, ties to the lower index (ONNX TopK): what transformers' beam search ranks. onnxruntime's vectorised,
    threaded kernels do this faster than numpy, and on CUDA only the top k leave the device.

    Where the vocabulary has a divisor B near 64 (`beam_scores_block_size`; `block_size="auto"`), the top k is taken
    in two stages with the same results to the bit: the maximum of each block of B candidates, the k best blocks,
    then the top k of those blocks' k x B candidates. onnxruntime's `TopK` visits candidates one at a time and the
    block maximum is vectorised, so the ranking step takes less time (docs/experiments/speed-log.md).
    """
    import onnx

    decoder = onnx.load(str(output_dir / DECODER_FILE), load_external_data=False)
    logits_output = next(o for o in decoder.graph.output if o.name == LOGITS).type.tensor_type
    vocab_size = logits_output.shape.dim[-1].dim_value or None  # 0 where the exporter left it symbolic
    if block_size == "auto":
        block_size = beam_scores_block_size(vocab_size)
    model = beam_scores_model(
        logits_output.elem_type, vocab_size, decoder.opset_import, decoder.ir_version, block_size=block_size
    )
    onnx.checker.check_model(model)
    path = output_dir / BEAM_SCORES_FILE
    onnx.save(model, str(path))
    return path
