"""The standard layout's graphs: `encoder_model.onnx` (ids in, hidden states out) and `decoder_model_merged.onnx`,
the decoder Optimum and transformers.js run at every step, with its `use_cache_branch` input.

The merged decoder is this package's one-step decoder (`graphs.DecoderStep`, which takes any past length and the
cross-attention K/V as inputs) behind one small `If` node on `use_cache_branch`:

- then (later steps): the `past_key_values.*` inputs, unchanged;
- else (first step): an empty self-attention past (batch, heads, 0, d_head) and every decoder layer's cross-attention
  K/V, projected from `encoder_hidden_states` with its `encoder_attn.k_proj` / `v_proj` and split into heads.

The `If` yields the past the decoder body reads and the `present.{i}.encoder.*` outputs, so the body, and its weights,
are in the file once (Optimum's own merged decoder holds two decoder bodies, one per branch). At the first step the
`past_key_values.*` inputs are never read: consumers feed zero-length placeholders there, sized from the config as
they see fit (Optimum sizes them with the encoder's head count), so their head and head-size dims are symbolic.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from vanilla_transformer_ort.contract import LAST_HIDDEN_STATE, cache_names, is_self_attention

from .graphs import TRACE_BATCH, TRACE_PAST_LEN, TRACE_SOURCE_LEN, TRACE_TARGET_LEN, DecoderStep

# Graph I/O names and symbolic dims, as Optimum writes them (docs/onnx-standard-layout.md).
INPUT_IDS, ATTENTION_MASK = "input_ids", "attention_mask"
ENCODER_ATTENTION_MASK, ENCODER_HIDDEN_STATES = "encoder_attention_mask", "encoder_hidden_states"
USE_CACHE_BRANCH, LOGITS = "use_cache_branch", "logits"
PAST_PREFIX, PRESENT_PREFIX = "past_key_values", "present"
BATCH, SOURCE, TARGET = "batch_size", "encoder_sequence_length", "decoder_sequence_length"
PAST = "past_decoder_sequence_length"
PAST_SOURCE = "past_encoder_sequence_length"  # 0 at the first step, the source length after it
PAST_HEADS, PAST_HEAD_SIZE = "past_num_heads", "past_head_size"  # see the module docstring
PRESENT_TARGET = f"{PAST} + {TARGET}"
SELECTED_PREFIX = "selected_past"  # the If's self-attention outputs: the past the decoder body reads
CROSS_PREFIX = "cross_kv/"  # names of the cross K/V projections inside the If's else branch


class Encoder(nn.Module):
    """The encoder stack alone: `last_hidden_state` (batch, src_len, d_model)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.encoder = model.model.encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask, return_dict=True).last_hidden_state


class CrossKV(nn.Module):
    """Every decoder layer's cross-attention key and value, projected from the encoder output (the If's else)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.cross_attentions = nn.ModuleList(layer.encoder_attn for layer in model.model.decoder.layers)

    def forward(self, encoder_hidden_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outputs = []
        for attention in self.cross_attentions:
            # (batch, src_len, d_model) -> (batch, heads, src_len, d_head), as the layer does at the first step
            outputs.append(attention.split_heads(attention.k_proj(encoder_hidden_states)))
            outputs.append(attention.split_heads(attention.v_proj(encoder_hidden_states)))
        return tuple(outputs)


def past_names(num_layers: int) -> list[str]:
    """`past_key_values.{i}.{decoder,encoder}.{key,value}`, in Optimum's order (per layer: decoder.key,
    decoder.value, encoder.key, encoder.value)."""
    return cache_names(num_layers, PAST_PREFIX)


def present_names(num_layers: int) -> list[str]:
    """`present.{i}.{decoder,encoder}.{key,value}`, in the same order."""
    return cache_names(num_layers, PRESENT_PREFIX)


def decoder_input_names(num_layers: int) -> list[str]:
    """The merged decoder's inputs, in Optimum's order."""
    return [ENCODER_ATTENTION_MASK, INPUT_IDS, ENCODER_HIDDEN_STATES, *past_names(num_layers), USE_CACHE_BRANCH]


def decoder_output_names(num_layers: int) -> list[str]:
    """`logits`, then every `present.*`."""
    return [LOGITS, *present_names(num_layers)]


def _export(module: nn.Module, args: tuple, path: Path, inputs: list, outputs: list, shapes, opset: int) -> None:
    with torch.no_grad():
        torch.onnx.export(
            module.eval(), args, path, dynamo=True, input_names=inputs, output_names=outputs,
            dynamic_shapes=shapes, opset_version=opset, external_data=False,
        )  # fmt: skip


def export_encoder(model: nn.Module, path: Path, opset: int) -> None:
    """`encoder_model.onnx`: input_ids, attention_mask (batch_size, encoder_sequence_length) int64 ->
    last_hidden_state (batch_size, encoder_sequence_length, d_model)."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(4, model.config.vocab_size, (TRACE_BATCH, TRACE_SOURCE_LEN), generator=generator)
    mask = torch.ones(TRACE_BATCH, TRACE_SOURCE_LEN, dtype=torch.int64)
    mask[1, -2:] = 0  # padding, so no all-ones shortcut is traced
    shapes = ({0: BATCH, 1: SOURCE}, {0: BATCH, 1: SOURCE})
    _export(Encoder(model), (input_ids, mask), path, [INPUT_IDS, ATTENTION_MASK], [LAST_HIDDEN_STATE], shapes, opset)


def _export_parts(model: nn.Module, folder: Path, opset: int):
    """The decoder body (`DecoderStep`) and the cross K/V projections as two ONNX models."""
    import onnx

    config = model.config
    num_layers, heads = config.decoder_layers, config.decoder_attention_heads
    d_head = config.d_model // heads
    batch, src_len, tgt_len, past_len = TRACE_BATCH, TRACE_SOURCE_LEN, TRACE_TARGET_LEN, TRACE_PAST_LEN
    generator = torch.Generator().manual_seed(0)
    decoder_ids = torch.randint(4, config.target_vocab_size, (batch, tgt_len), generator=generator)
    mask = torch.ones(batch, src_len, dtype=torch.int64)
    mask[1, -2:] = 0
    cache = []
    for _ in range(num_layers):
        cache += [torch.randn(batch, heads, past_len, d_head, generator=generator) for _ in range(2)]
        cache += [torch.randn(batch, heads, src_len, d_head, generator=generator) for _ in range(2)]
    per_layer = [{0: BATCH, 2: PAST}, {0: BATCH, 2: PAST}, {0: BATCH, 2: SOURCE}, {0: BATCH, 2: SOURCE}]
    body_path = folder / "decoder_body.onnx"
    body_outputs = [LOGITS] + [name for name in present_names(num_layers) if is_self_attention(name)]
    _export(
        DecoderStep(model), (decoder_ids, mask, cache), body_path,
        [INPUT_IDS, ENCODER_ATTENTION_MASK, *past_names(num_layers)], body_outputs,
        ({0: BATCH, 1: TARGET}, {0: BATCH, 1: SOURCE}, per_layer * num_layers), opset,
    )  # fmt: skip
    hidden = torch.randn(batch, src_len, config.d_model, generator=generator)
    cross_path = folder / "cross_kv.onnx"
    cross_outputs = [name for name in present_names(num_layers) if not is_self_attention(name)]
    _export(CrossKV(model), (hidden,), cross_path, [ENCODER_HIDDEN_STATES], cross_outputs,
            ({0: BATCH, 1: SOURCE},), opset)  # fmt: skip
    body, cross = onnx.load(str(body_path)), onnx.load(str(cross_path))
    body_path.unlink()
    cross_path.unlink()
    # Every name of the projections gets a prefix (the If's else branch must not reuse a name of the body), except
    # its input, the merged graph's `encoder_hidden_states`.
    onnx.compose.add_prefix_graph(cross.graph, CROSS_PREFIX, rename_inputs=False, inplace=True)
    return body, cross


def _rename_inputs(graph, mapping: dict[str, str]) -> None:
    """Point every node input named in `mapping` at its new name, in nested graphs too."""
    for node in graph.node:
        node.input[:] = [mapping.get(name, name) for name in node.input]
        for attribute in node.attribute:
            for subgraph in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                _rename_inputs(subgraph, mapping)


def _cache_branches(cross, num_layers: int, heads: int, d_head: int):
    """The If's two branches; outputs per layer: self key, self value, cross key, cross value."""
    from onnx import TensorProto, helper

    names = past_names(num_layers)
    then_nodes = [helper.make_node("Identity", [name], [f"then.{name}"]) for name in names]
    else_nodes = [  # an empty self-attention past (batch, heads, 0, d_head)
        helper.make_node("Shape", [ENCODER_HIDDEN_STATES], ["else.batch"], start=0, end=1),
        helper.make_node("Constant", [], ["else.rest"], value=helper.make_tensor("rest", TensorProto.INT64, [3],
                                                                                [heads, 0, d_head])),
        helper.make_node("Concat", ["else.batch", "else.rest"], ["else.empty_shape"], axis=0),
        helper.make_node("ConstantOfShape", ["else.empty_shape"], ["else.empty"],
                         value=helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0])),
    ]  # fmt: skip
    else_nodes += list(cross.graph.node)  # the cross K/V projections; their weights are the main graph's
    else_outputs = []
    for name in names:
        if is_self_attention(name):
            else_nodes.append(helper.make_node("Identity", ["else.empty"], [f"else.{name}"]))
            else_outputs.append(f"else.{name}")
        else:
            else_outputs.append(CROSS_PREFIX + name.replace(PAST_PREFIX, PRESENT_PREFIX, 1))
    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, None)  # noqa: E731
    then_graph = helper.make_graph(then_nodes, "use_cache", [], [value(f"then.{name}") for name in names])
    else_graph = helper.make_graph(else_nodes, "first_step", [], [value(name) for name in else_outputs])
    return then_graph, else_graph


def build_merged_decoder(model: nn.Module, folder: Path, opset: int):
    """`decoder_model_merged.onnx` as an in-memory ONNX model (see the module docstring); `folder` holds the parts
    while they are exported."""
    import onnx
    from onnx import TensorProto, helper

    config = model.config
    num_layers, heads = config.decoder_layers, config.decoder_attention_heads
    d_head = config.d_model // heads
    body, cross = _export_parts(model, folder, opset)
    graph = body.graph
    names = past_names(num_layers)
    # The body now reads the If's outputs: the self-attention past it selects, and the cross K/V it yields.
    selected = {
        name: name.replace(PAST_PREFIX, SELECTED_PREFIX if is_self_attention(name) else PRESENT_PREFIX, 1)
        for name in names
    }
    _rename_inputs(graph, selected)
    then_graph, else_graph = _cache_branches(cross, num_layers, heads, d_head)
    if_node = helper.make_node(
        "If", [USE_CACHE_BRANCH], [selected[name] for name in names], name="use_cache_branch_if",
        then_branch=then_graph, else_branch=else_graph,
    )  # fmt: skip
    nodes = [if_node, *graph.node]
    initializers = [*graph.initializer, *cross.graph.initializer]
    if len({init.name for init in initializers}) != len(initializers):
        raise ValueError("the decoder body and the cross K/V projections have initializers of the same name")
    vocab = config.target_vocab_size
    tensor = lambda name, elem, dims: helper.make_tensor_value_info(name, elem, dims)  # noqa: E731
    inputs = [
        tensor(ENCODER_ATTENTION_MASK, TensorProto.INT64, [BATCH, SOURCE]),
        tensor(INPUT_IDS, TensorProto.INT64, [BATCH, TARGET]),
        tensor(ENCODER_HIDDEN_STATES, TensorProto.FLOAT, [BATCH, SOURCE, config.d_model]),
    ]
    for name in names:
        length = PAST if is_self_attention(name) else PAST_SOURCE
        inputs.append(tensor(name, TensorProto.FLOAT, [BATCH, PAST_HEADS, length, PAST_HEAD_SIZE]))
    inputs.append(tensor(USE_CACHE_BRANCH, TensorProto.BOOL, [1]))
    outputs = [tensor(LOGITS, TensorProto.FLOAT, [BATCH, TARGET, vocab])]
    for name in present_names(num_layers):
        length = PRESENT_TARGET if is_self_attention(name) else SOURCE
        outputs.append(tensor(name, TensorProto.FLOAT, [BATCH, heads, length, d_head]))
    merged_graph = helper.make_graph(nodes, "decoder_model_merged", inputs, outputs, initializers)
    merged = helper.make_model(merged_graph, opset_imports=list(body.opset_import), ir_version=body.ir_version)
    merged.functions.extend(body.functions)
    merged.functions.extend(f for f in cross.functions if f.name not in {g.name for g in body.functions})
    onnx.checker.check_model(merged, full_check=True)
    return merged
