"""The in-place decoder graph (`decoder_model_inplace.onnx`): one decoding step that never copies its cache.

The traced decoder (`graphs.DecoderStep`) concatenates the past with the new keys and values into fresh
`present.*` outputs, so every step copies the whole self-attention cache, and the cross-attention keys and values
are repeated for every beam. This graph does what onnxruntime's own generative decoders do instead:

- Self-attention (§3.2.3, masked) is onnxruntime's `GroupQueryAttention` with as many key/value heads as query
  heads, i.e. the paper's multi-head attention. Its past is a buffer preallocated for a capacity of positions; when
  the runtime binds `past_key_values.{i}.decoder.*` and `present.{i}.decoder.*` to the same buffer, the operator
  writes each row's new keys and values at positions `sequence_lengths[row] - new tokens ...` in place and reads
  only that row's first `sequence_lengths[row]` positions. Q, K and V come from one packed (d_model, 3 d_model)
  projection.
- Cross-attention is onnxruntime's `MultiHeadAttention` over the encoder's keys and values held once per source,
  (batch, heads, src_len, d_k): the queries of a source's beams, (batch x beams, new, d_model), are regrouped into
  one query sequence (batch, beams x new, d_model). Cross-attention has no mask between queries, so each query
  attends exactly as it would alone, and no key or value is ever repeated per beam.

The graph is built node by node from the model's weights, as onnxruntime's generative-model builder builds its
graphs: torch.onnx does not emit these two contrib operators. Every other computation follows the model: token
embeddings x sqrt(d_model) plus the sinusoid of §3.5 at positions past_len, past_len + 1, ..., post-LN (or pre-LN)
residual blocks, the FFN's activation, the output projection and its optional bias. `validate_export` compares it
with PyTorch on the same grid as the traced graphs.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from torch import nn

from vanilla_transformer_ort.contract import (
    ENCODER_ATTENTION_MASK,
    INPLACE_DECODER_FILE,
    INPUT_IDS,
    LOGITS,
    PAST_PREFIX,
    PRESENT_PREFIX,
    SEQUENCE_LENGTHS,
    TOTAL_SEQUENCE_LENGTH,
    cache_names,
    is_self_attention,
)

INPLACE_OPSET = 20
MICROSOFT_DOMAIN = "com.microsoft"
# FFN activations this builder writes (transformers' ACT2FN names), each as the ONNX operators of its formula.
SUPPORTED_ACTIVATIONS = ("relu", "gelu", "silu", "swish")


class GraphBuilder:
    """Nodes and initializers of one ONNX graph, with unique names."""

    def __init__(self):
        self.nodes, self.initializers, self._count = [], [], 0

    def name(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}_{self._count}"

    def constant(self, array: np.ndarray, prefix: str = "const") -> str:
        from onnx import numpy_helper

        name = self.name(prefix)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def weight(self, tensor: torch.Tensor, name: str) -> str:
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(tensor.detach().float().contiguous().numpy(), name))
        return name

    def op(self, op_type: str, inputs: list[str], outputs: int | list[str] = 1, domain: str = "", **attributes):
        """Add one node; returns its output name (or the list of names when it has several)."""
        from onnx import helper

        names = outputs if isinstance(outputs, list) else [self.name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(
            helper.make_node(op_type, inputs, names, name=self.name(op_type), domain=domain or None, **attributes)
        )
        return names[0] if len(names) == 1 else names


def _linear(graph: GraphBuilder, x: str, weights: list[nn.Linear], name: str) -> str:
    """x W^T + b for one or several `Linear` modules side by side (the packed Q, K, V projection)."""
    weight = torch.cat([w.weight for w in weights], dim=0).T  # (in, sum of outs): stored transposed for MatMul
    out = graph.op("MatMul", [x, graph.weight(weight, f"{name}.weight_transposed")])
    if all(w.bias is not None for w in weights):
        out = graph.op("Add", [out, graph.weight(torch.cat([w.bias for w in weights]), f"{name}.bias")])
    return out


def _layer_norm(graph: GraphBuilder, x: str, norm: nn.LayerNorm, name: str) -> str:
    scale, bias = graph.weight(norm.weight, f"{name}.weight"), graph.weight(norm.bias, f"{name}.bias")
    return graph.op("LayerNormalization", [x, scale, bias], axis=-1, epsilon=float(norm.eps))


def _residual(graph: GraphBuilder, x: str, norm, sublayer, name: str) -> str:
    """Post-LN `LayerNorm(x + Sublayer(x))` (§5.4, the paper's), or pre-LN `x + Sublayer(LayerNorm(x))`."""
    if norm.normalize_before:
        return graph.op("Add", [x, sublayer(_layer_norm(graph, x, norm, name))])
    return _layer_norm(graph, graph.op("Add", [x, sublayer(x)]), norm, name)


def _activation(graph: GraphBuilder, x: str, function: str) -> str:
    if function == "relu":  # max(0, x), the paper's (§3.3)
        return graph.op("Relu", [x])
    if function == "gelu":
        return graph.op("Gelu", [x])
    return graph.op("Mul", [x, graph.op("Sigmoid", [x])])  # silu / swish: x * sigmoid(x)


def _positions(graph: GraphBuilder, lengths: str, new_len: str, d_model: int) -> str:
    """PE(pos) of §3.5 for each row's pos = length - new_len, ..., length - 1, with `lengths` (rows,) int32 each row's
    past plus new tokens: (rows, new_len, d_model), sin and cos interleaved."""
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32)  # as `sinusoidal_positional_encoding` computes them
    inv_freq = torch.exp(two_i * (-math.log(10000.0) / d_model))  # (d_model/2,)
    one = graph.constant(np.array([1], np.int64))
    offsets = graph.op("Range", [graph.constant(np.array(0, np.int64)), graph.op("Squeeze", [new_len]),
                                 graph.constant(np.array(1, np.int64))])  # (new,): 0 .. new - 1  # fmt: skip
    starts = graph.op("Sub", [graph.op("Cast", [lengths], to=7), new_len])  # (rows,) int64: each row's past length
    # (rows,) -> (rows, 1) + (new,) -> (rows, new)
    positions = graph.op("Cast", [graph.op("Add", [graph.op("Unsqueeze", [starts, one]), offsets])], to=1)
    angles = graph.op("Mul", [graph.op("Unsqueeze", [positions, graph.constant(np.array([2], np.int64))]),
                              graph.weight(inv_freq, "positions.inv_freq")])  # (rows, new, d/2)  # fmt: skip
    axis = graph.constant(np.array([3], np.int64))
    pairs = graph.op("Concat", [graph.op("Unsqueeze", [graph.op("Sin", [angles]), axis]),
                                graph.op("Unsqueeze", [graph.op("Cos", [angles]), axis])], axis=3)  # fmt: skip
    # (rows, new, d/2, 2) -> (rows, new, d): sin at 2i, cos at 2i+1
    return graph.op("Reshape", [pairs, graph.constant(np.array([0, 0, d_model], np.int64))])


def build_inplace_decoder(model: nn.Module, tie_output_projection: bool = True):
    """The in-place decoder step of `model` (a `VanillaTransformerForConditionalGeneration`) as an `onnx.ModelProto`.

    Inputs: `input_ids` (rows, new) int64 with rows = batch x beams, each source's beams adjacent;
    `encoder_attention_mask` (batch, src_len); `total_sequence_length` () int32 = the largest past length + new;
    `sequence_lengths` (rows,) int32 = each row's own past length + new (rows that joined a running batch at different
    steps decode side by side: each row's positions and attended cache end at its own length); then per layer
    `past_key_values.{i}.decoder.key/value` (rows, heads, capacity, d_k) with capacity >= total_sequence_length, and
    `past_key_values.{i}.encoder.key/value` (batch, heads, src_len, d_k), once per source. Outputs: `logits`
    (rows, new, vocab) and `present.{i}.decoder.key/value`, the cache buffers (shared with the past when bound so).

    `tie_output_projection`: where the model ties its output projection to the embedding (§3.4), compute the logits
    from the lookup's own table with a `FusedMatMul` (transB), one copy of the table in the graph; False gives the
    projection its own pre-transposed (d_model, vocab) weight for a `MatMul`, the form int8 quantization takes.
    """
    from onnx import TensorProto, helper

    config = model.config
    if config.activation_function not in SUPPORTED_ACTIVATIONS:
        raise ValueError(
            f"The in-place decoder graph writes the FFN activations {SUPPORTED_ACTIVATIONS}, not "
            f"{config.activation_function!r}; export with decoder_cache='copy'"
        )
    decoder = model.model.decoder
    d_model, heads = config.d_model, config.decoder_attention_heads
    d_k = d_model // heads
    graph = GraphBuilder()

    shape = graph.op("Shape", [INPUT_IDS])
    new_len = graph.op("Slice", [shape, *(graph.constant(np.array([v], np.int64)) for v in (1, 2))])  # (1,)
    # GroupQueryAttention's per-row index of the last valid position: each row's length - 1 (rows may differ)
    seqlens_k = graph.op("Sub", [SEQUENCE_LENGTHS, graph.constant(np.array(1, np.int32))])  # (rows,) int32
    source_mask = graph.op("Cast", [ENCODER_ATTENTION_MASK], to=6)  # int32 (batch, src_len), 1 = token

    embed_table = graph.weight(decoder.embed_tokens.weight, "embed_tokens.weight")  # (vocab, d_model)
    embeddings = graph.op("Gather", [embed_table, INPUT_IDS])
    scale = graph.constant(np.array(decoder.input_representation.embed_scale, np.float32))  # sqrt(d_model) (§3.4)
    hidden = graph.op("Add", [graph.op("Mul", [embeddings, scale]), _positions(graph, SEQUENCE_LENGTHS, new_len,
                                                                                d_model)])  # fmt: skip
    past, present = cache_names(config.decoder_layers, PAST_PREFIX), cache_names(config.decoder_layers, PRESENT_PREFIX)
    query_shape = graph.op("Shape", [hidden])  # (rows, new, d_model)
    for i, layer in enumerate(decoder.layers):
        own_key, own_value, cross_key, cross_value = past[4 * i : 4 * i + 4]
        prefix = f"layers.{i}"

        def self_attention(x: str, layer=layer, i=i, own_key=own_key, own_value=own_value, prefix=prefix) -> str:
            attn = layer.self_attn
            qkv = _linear(graph, x, [attn.q_proj, attn.k_proj, attn.v_proj], f"{prefix}.self_attn.qkv_proj")
            out = graph.op(
                "GroupQueryAttention",
                [qkv, "", "", own_key, own_value, seqlens_k, TOTAL_SEQUENCE_LENGTH],
                [graph.name("self_attn"), present[4 * i], present[4 * i + 1]],
                domain=MICROSOFT_DOMAIN, num_heads=heads, kv_num_heads=heads, scale=float(attn.scaling),
            )[0]  # fmt: skip
            return _linear(graph, out, [attn.out_proj], f"{prefix}.self_attn.out_proj")

        def cross_attention(x: str, layer=layer, cross_key=cross_key, cross_value=cross_value, prefix=prefix) -> str:
            attn = layer.encoder_attn
            query = _linear(graph, x, [attn.q_proj], f"{prefix}.encoder_attn.q_proj")  # (rows, new, d_model)
            batch = graph.op("Slice", [graph.op("Shape", [cross_key]),
                                       *(graph.constant(np.array([v], np.int64)) for v in (0, 1))])  # fmt: skip
            grouped_shape = graph.op("Concat", [batch, graph.constant(np.array([-1, d_model], np.int64))], axis=0)
            # (batch x beams, new, d_model) -> (batch, beams x new, d_model): one query sequence per source
            grouped = graph.op("Reshape", [query, grouped_shape])
            out = graph.op(
                "MultiHeadAttention", [grouped, cross_key, cross_value, "", source_mask],
                domain=MICROSOFT_DOMAIN, num_heads=heads, scale=float(attn.scaling),
            )  # fmt: skip
            out = graph.op("Reshape", [out, query_shape])  # (batch, beams x new, d_model) -> (rows, new, d_model)
            return _linear(graph, out, [attn.out_proj], f"{prefix}.encoder_attn.out_proj")

        def feed_forward(x: str, layer=layer, prefix=prefix) -> str:
            inner = _activation(graph, _linear(graph, x, [layer.fc1], f"{prefix}.fc1"), config.activation_function)
            return _linear(graph, inner, [layer.fc2], f"{prefix}.fc2")

        hidden = _residual(graph, hidden, layer.self_attn_layer_norm, self_attention, f"{prefix}.self_attn_layer_norm")
        hidden = _residual(
            graph, hidden, layer.encoder_attn_layer_norm, cross_attention, f"{prefix}.encoder_attn_layer_norm"
        )
        hidden = _residual(graph, hidden, layer.final_layer_norm, feed_forward, f"{prefix}.final_layer_norm")
    if decoder.layer_norm is not None:  # pre-LN stacks end with a LayerNorm
        hidden = _layer_norm(graph, hidden, decoder.layer_norm, "layer_norm")
    bias = getattr(model, "final_logits_bias", None)
    if tie_output_projection and model.lm_head.weight is decoder.embed_tokens.weight:
        # The output projection reads the lookup's own table (vocab, d_model): one copy of the shared embedding.
        # FusedMatMul takes it transposed and writes (rows, new, vocab) straight into the graph's output; a 2-D
        # Gemm needed a Reshape after it, which copied the logits (8 MB a step at 64 rows x 32,000).
        outputs = 1 if bias is not None else [LOGITS]
        logits = graph.op("FusedMatMul", [hidden, embed_table], outputs, domain=MICROSOFT_DOMAIN, transB=1)
        if bias is not None:
            graph.op("Add", [logits, graph.weight(bias[0], "final_logits_bias")], [LOGITS])
    else:
        logits_inputs = [hidden, graph.weight(model.lm_head.weight.T, "lm_head.weight_transposed")]
        if bias is None:
            graph.op("MatMul", logits_inputs, [LOGITS])
        else:
            graph.op("Add", [graph.op("MatMul", logits_inputs), graph.weight(bias[0], "final_logits_bias")], [LOGITS])

    def tensor(name: str, elem_type: int, dims: list) -> object:
        return helper.make_tensor_value_info(name, elem_type, dims)

    rows_dim, batch_dim, capacity_dim = "rows", "batch_size", "cache_capacity"
    inputs = [
        tensor(INPUT_IDS, TensorProto.INT64, [rows_dim, "decoder_sequence_length"]),
        tensor(ENCODER_ATTENTION_MASK, TensorProto.INT64, [batch_dim, "encoder_sequence_length"]),
        tensor(TOTAL_SEQUENCE_LENGTH, TensorProto.INT32, []),
        tensor(SEQUENCE_LENGTHS, TensorProto.INT32, [rows_dim]),
    ]
    for name in past:
        dims = [rows_dim, heads, capacity_dim, d_k] if is_self_attention(name) else [
            batch_dim, heads, "encoder_sequence_length", d_k]  # fmt: skip
        inputs.append(tensor(name, TensorProto.FLOAT, dims))
    outputs = [tensor(LOGITS, TensorProto.FLOAT, [rows_dim, "decoder_sequence_length", config.target_vocab_size])]
    outputs += [tensor(name, TensorProto.FLOAT, [rows_dim, heads, capacity_dim, d_k])
                for name in present if is_self_attention(name)]  # fmt: skip
    onnx_graph = helper.make_graph(graph.nodes, "decoder_inplace", inputs, outputs, graph.initializers)
    opsets = [helper.make_opsetid("", INPLACE_OPSET), helper.make_opsetid(MICROSOFT_DOMAIN, 1)]
    return helper.make_model(onnx_graph, opset_imports=opsets, producer_name="vanilla_transformer")


@torch.no_grad()
def export_inplace_decoder(model: nn.Module, output_dir: str | Path, tie_output_projection: bool = True) -> Path:
    """Write `decoder_model_inplace.onnx` (fp32) into `output_dir`; returns its path (`tie_output_projection`: see
    `build_inplace_decoder`)."""
    import onnx

    path = Path(output_dir) / INPLACE_DECODER_FILE
    onnx.save(build_inplace_decoder(model.eval(), tie_output_projection), str(path))
    return path
