"""ONNX export: an encoder graph (with every decoder layer's cross-attention K/V) and a one-step decoder graph.

The graphs take and return flat tensors only (cache objects cannot be graph inputs); the wrappers below rebuild the
`EncoderDecoderCache` inside `forward`, so no export hook leaks into the model layers. Names follow optimum's
convention; `export/README.md` documents them. Optional variants: fp16 (GPU serving) and dynamic int8.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import DynamicCache, EncoderDecoderCache

logger = logging.getLogger(__name__)

ENCODER_FILE = "encoder_model.onnx"
DECODER_FILE = "decoder_model.onnx"
MANIFEST_FILE = "manifest.json"
REORDER_FILE = "cache_reorder.onnx"
BEAM_SCORES_FILE = "beam_scores.onnx"
DEFAULT_OPSET = 20
FP32_TOLERANCE = 1e-4
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# Sample sizes for tracing: all >= 2 and pairwise different, so torch.export specialises no dynamic dimension
# (a 0 or 1 would be frozen into the graph, ONNX-FACTS.md).
TRACE_BATCH, TRACE_SOURCE_LEN, TRACE_TARGET_LEN, TRACE_PAST_LEN = 2, 7, 3, 5


def cache_names(num_layers: int, prefix: str) -> list[str]:
    """Flat KV names in optimum's order: per layer decoder.key, decoder.value, encoder.key, encoder.value."""
    return [
        f"{prefix}.{i}.{part}.{kind}"
        for i in range(num_layers)
        for part in ("decoder", "encoder")
        for kind in ("key", "value")
    ]


def encoder_output_names(num_layers: int) -> list[str]:
    """`last_hidden_state`, then `present.{i}.encoder.key/value` for every decoder layer."""
    return ["last_hidden_state"] + [n for n in cache_names(num_layers, "present") if ".encoder." in n]


def decoder_input_names(num_layers: int) -> list[str]:
    """`input_ids`, `encoder_attention_mask`, then all `past_key_values.{i}.{decoder,encoder}.{key,value}`."""
    return ["input_ids", "encoder_attention_mask"] + cache_names(num_layers, "past_key_values")


def decoder_output_names(num_layers: int) -> list[str]:
    """`logits`, then `present.{i}.decoder.key/value` (the self-attention cache grown by the new tokens)."""
    return ["logits"] + [n for n in cache_names(num_layers, "present") if ".decoder." in n]


def split_heads(projected: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(batch, len, d_model) -> (batch, heads, len, d_head), the layout the attention cache stores."""
    batch, length, _ = projected.shape
    return projected.view(batch, length, num_heads, -1).transpose(1, 2)


class EncoderWithCrossKV(nn.Module):
    """Encoder plus the cross-attention keys/values of every decoder layer, computed once per source."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.encoder = model.model.encoder
        self.cross_attentions = nn.ModuleList(layer.encoder_attn for layer in model.model.decoder.layers)
        self.num_heads = model.config.decoder_attention_heads

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask, return_dict=True).last_hidden_state
        outputs = [hidden]  # (batch, src_len, d_model)
        for attention in self.cross_attentions:
            outputs.append(split_heads(attention.k_proj(hidden), self.num_heads))  # (batch, heads, src_len, d_head)
            outputs.append(split_heads(attention.v_proj(hidden), self.num_heads))
        return tuple(outputs)


class DecoderStep(nn.Module):
    """One decoding step for any past length (zero included) and any number of new tokens.

    `cache_tensors` holds 4 tensors per layer in `cache_names` order: self-attention key/value
    (batch, heads, past_len, d_head) and cross-attention key/value (batch, heads, src_len, d_head).
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.decoder = model.model.decoder
        self.lm_head = model.lm_head
        self.final_logits_bias = getattr(model, "final_logits_bias", None)  # (1, vocab) with add_final_logits_bias
        self.num_layers = model.config.decoder_layers

    def forward(
        self, input_ids: torch.Tensor, encoder_attention_mask: torch.Tensor, cache_tensors: list[torch.Tensor]
    ) -> tuple[torch.Tensor, ...]:
        self_kv = [(cache_tensors[4 * i], cache_tensors[4 * i + 1]) for i in range(self.num_layers)]
        cross_kv = [(cache_tensors[4 * i + 2], cache_tensors[4 * i + 3]) for i in range(self.num_layers)]
        # A cross cache built from tensors is marked `is_updated`: the decoder reads K/V and never re-projects.
        cache = EncoderDecoderCache(DynamicCache(self_kv), DynamicCache(cross_kv))
        key = cross_kv[0][0]
        # Only the shape of the encoder states is read (masks); (batch, heads, src, d_head) -> (batch, src, d_model).
        encoder_hidden_states = key.transpose(1, 2).reshape(key.shape[0], key.shape[2], -1)
        outputs = self.decoder(
            input_ids=input_ids,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            cache=cache,
            use_cache=True,
            return_dict=True,
        )
        logits = self.lm_head(outputs.last_hidden_state)  # (batch, tgt_len, vocab)
        if self.final_logits_bias is not None:
            logits = logits + self.final_logits_bias
        presents = []
        for i in range(self.num_layers):
            layer = outputs.cache.self_attention_cache.layers[i]
            presents += [layer.keys, layer.values]  # (batch, heads, past_len + tgt_len, d_head)
        return (logits, *presents)


def _sample_inputs(config, dtype: torch.dtype = torch.float32) -> tuple[tuple, tuple]:
    """Trace inputs for both graphs; the source mask has padding so no all-ones shortcut is traced."""
    batch, src_len, tgt_len, past_len = TRACE_BATCH, TRACE_SOURCE_LEN, TRACE_TARGET_LEN, TRACE_PAST_LEN
    heads = config.decoder_attention_heads
    d_head = config.d_model // heads
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(4, config.vocab_size, (batch, src_len), generator=generator)
    mask = torch.ones(batch, src_len, dtype=torch.int64)
    mask[1, -2:] = 0
    decoder_ids = torch.randint(4, config.target_vocab_size, (batch, tgt_len), generator=generator)
    cache = []
    for _ in range(config.decoder_layers):
        cache += [torch.randn(batch, heads, past_len, d_head, generator=generator, dtype=dtype) for _ in range(2)]
        cache += [torch.randn(batch, heads, src_len, d_head, generator=generator, dtype=dtype) for _ in range(2)]
    return (input_ids, mask), (decoder_ids, mask, cache)


def _dynamic_shapes(num_layers: int) -> tuple[tuple, tuple]:
    batch, src, tgt, past = "batch_size", "encoder_sequence_length", "decoder_sequence_length", "past_sequence_length"
    encoder = ({0: batch, 1: src}, {0: batch, 1: src})
    per_layer = [{0: batch, 2: past}, {0: batch, 2: past}, {0: batch, 2: src}, {0: batch, 2: src}]
    decoder = ({0: batch, 1: tgt}, {0: batch, 1: src}, per_layer * num_layers)
    return encoder, decoder


def export_graphs(model: nn.Module, output_dir: str | os.PathLike, opset: int = DEFAULT_OPSET) -> tuple[Path, Path]:
    """Export `encoder_model.onnx` and `decoder_model.onnx` (fp32) into `output_dir`; returns their paths."""
    model = model.eval()
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    encoder_path, decoder_path = output_dir / ENCODER_FILE, output_dir / DECODER_FILE
    # Eager attention exports as MatMul(Q, Transpose(K)), which onnxruntime fuses into one FusedMatMul. torch's sdpa
    # decomposition reshapes K to 3D before transposing it, so that transpose cannot be fused and ran as a strided
    # copy of every cached key on every step: 43% of a beam-4 batch-16 step at base size.
    attn_implementation = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        _export(model, encoder_path, decoder_path, opset)
    finally:
        model.set_attn_implementation(attn_implementation)
    return encoder_path, decoder_path


def _export(model: nn.Module, encoder_path: Path, decoder_path: Path, opset: int) -> None:
    num_layers = model.config.decoder_layers
    encoder_args, decoder_args = _sample_inputs(model.config)
    encoder_shapes, decoder_shapes = _dynamic_shapes(num_layers)
    with torch.no_grad():
        torch.onnx.export(
            EncoderWithCrossKV(model).eval(),
            encoder_args,
            encoder_path,
            dynamo=True,
            input_names=["input_ids", "attention_mask"],
            output_names=encoder_output_names(num_layers),
            dynamic_shapes=encoder_shapes,
            opset_version=opset,
            external_data=False,
        )
        torch.onnx.export(
            DecoderStep(model).eval(),
            decoder_args,
            decoder_path,
            dynamo=True,
            input_names=decoder_input_names(num_layers),
            output_names=decoder_output_names(num_layers),
            dynamic_shapes=decoder_shapes,
            opset_version=opset,
            external_data=False,
        )


# ---------------------------------------------------------------------------------------------------------------
# fp16 and int8 variants
# ---------------------------------------------------------------------------------------------------------------


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


def quantize_int8(path: Path) -> None:
    """Dynamic int8 quantization of one graph, in place.

    Weights of the linear layers become int8 (activations are quantized per call); the embedding table is stored in
    int8 too and only the gathered rows are dequantized. Attention score products stay fp32 (no weight operand).
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    fp32_path = path.with_suffix(".fp32.onnx")
    path.rename(fp32_path)
    try:
        operators = ["MatMul", "Gemm", "Gather"]
        quantize_dynamic(fp32_path, path, weight_type=QuantType.QInt8, op_types_to_quantize=operators)
    finally:
        fp32_path.unlink()
        for extra in path.parent.glob(f"{fp32_path.stem}*-inferred.onnx"):
            extra.unlink()


def write_cache_reorder_graph(output_dir: Path) -> Path:
    """A weightless helper graph that gathers self-attention cache rows (beam reordering) where the cache lives.

    Inputs: `beam_idx` (reordered_batch_size,) int64 and every `past_key_values.{i}.decoder.key/value`; outputs
    `reordered.{i}.decoder.key/value`. The runtime uses it with I/O binding so that beam search on CUDA never copies
    the cache to the host; its dtype follows the decoder graph's cache inputs (fp32 or fp16).
    """
    import onnx
    from onnx import TensorProto, helper

    decoder = onnx.load(str(output_dir / DECODER_FILE), load_external_data=False)
    cache_inputs = [value for value in decoder.graph.input if ".decoder." in value.name]
    index = helper.make_tensor_value_info("beam_idx", TensorProto.INT64, ["reordered_batch_size"])
    inputs, outputs, nodes = [index], [], []
    for value in cache_inputs:
        dims = [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]  # (batch, heads, past, d_head)
        elem_type = value.type.tensor_type.elem_type
        name = value.name.replace("past_key_values.", "reordered.", 1)
        inputs.append(helper.make_tensor_value_info(value.name, elem_type, dims))
        outputs.append(helper.make_tensor_value_info(name, elem_type, ["reordered_batch_size", *dims[1:]]))
        nodes.append(helper.make_node("Gather", [value.name, "beam_idx"], [name], axis=0))
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
    logits_type = next(o for o in decoder.graph.output if o.name == "logits").type.tensor_type.elem_type
    nodes = [helper.make_node("Gather", ["logits", "last_position"], ["last_logits"], axis=1)]  # (rows, V)
    if logits_type != TensorProto.FLOAT:
        nodes.append(helper.make_node("Cast", ["last_logits"], ["last_logits_fp32"], to=TensorProto.FLOAT))
    nodes += [
        helper.make_node("LogSoftmax", [nodes[-1].output[0]], ["log_probs"], axis=-1),
        helper.make_node("Add", ["log_probs", "bias"], ["processed"]),
        helper.make_node("Add", ["processed", "running_scores"], ["scores"]),
        helper.make_node("Reshape", ["scores", "scores_shape"], ["sentence_scores"]),  # (batch, num_beams * V)
        helper.make_node("TopK", ["sentence_scores", "k"], ["values", "indices"], axis=-1, largest=1, sorted=1),
    ]
    graph = helper.make_graph(
        nodes,
        "beam_scores",
        [
            helper.make_tensor_value_info("logits", logits_type, ["rows", "new_tokens", "vocab"]),
            helper.make_tensor_value_info("running_scores", TensorProto.FLOAT, ["rows", 1]),
            helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["vocab"]),
            helper.make_tensor_value_info("scores_shape", TensorProto.INT64, [2]),
            helper.make_tensor_value_info("k", TensorProto.INT64, [1]),
        ],
        [
            helper.make_tensor_value_info("values", TensorProto.FLOAT, ["batch", "k"]),
            helper.make_tensor_value_info("indices", TensorProto.INT64, ["batch", "k"]),
        ],
        [helper.make_tensor("last_position", TensorProto.INT64, [], [-1])],
    )
    model = helper.make_model(graph, opset_imports=list(decoder.opset_import), ir_version=decoder.ir_version)
    onnx.checker.check_model(model)
    path = output_dir / BEAM_SCORES_FILE
    onnx.save(model, str(path))
    return path


def optimize_variant(output_dir: Path, dtype: str, quantize: str | None) -> None:
    """Turn the fp32 graphs in `output_dir` into the requested variant, in place."""
    encoder_path, decoder_path = output_dir / ENCODER_FILE, output_dir / DECODER_FILE
    if dtype == "fp16":
        convert_to_fp16(encoder_path)
        convert_to_fp16(decoder_path)
    if quantize == "int8":
        if not untie_output_projection(decoder_path):
            logger.warning("Output projection pattern not found: the int8 decoder keeps the tied weight.")
        quantize_int8(encoder_path)
        quantize_int8(decoder_path)


# ---------------------------------------------------------------------------------------------------------------
# The export folder
# ---------------------------------------------------------------------------------------------------------------


def _graph_io(path: Path) -> dict:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph

    def describe(values) -> list[dict]:
        rows = []
        for value in values:
            tensor = value.type.tensor_type
            dims = [d.dim_param or d.dim_value for d in tensor.shape.dim]
            rows.append({"name": value.name, "dtype": onnx.TensorProto.DataType.Name(tensor.elem_type), "shape": dims})
        return rows

    return {"inputs": describe(graph.input), "outputs": describe(graph.output)}


def copy_tokenizer(tokenizer_dir: Path, output_dir: Path) -> None:
    """Copy `tokenizer.json` and its side files, or Marian's sentencepiece files (a model converted from Marian);
    raises ValueError when there is no tokenizer."""
    from vanilla_transformer_ort.marian_tokenizer import MARIAN_TOKENIZER_FILES, is_marian_tokenizer_folder

    names = TOKENIZER_FILES
    if not (tokenizer_dir / "tokenizer.json").is_file():
        if not is_marian_tokenizer_folder(tokenizer_dir):
            raise ValueError(f"No tokenizer.json in {tokenizer_dir}: the export folder needs the tokenizer to run.")
        names = MARIAN_TOKENIZER_FILES + ("special_tokens_map.json",)
    for name in names:
        if (tokenizer_dir / name).is_file():
            shutil.copy2(tokenizer_dir / name, output_dir / name)


def export_model(
    model_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    dtype: str = "fp32",
    quantize: str | None = None,
    opset: int = DEFAULT_OPSET,
    validate: bool = False,
    tokenizer_dir: str | os.PathLike | None = None,
    tolerance: float = FP32_TOLERANCE,
) -> dict:
    """Export a saved model folder into a self-contained ONNX folder; returns the manifest written with it.

    Args:
        model_dir: a `save_pretrained` folder of `VanillaTransformerForConditionalGeneration`.
        output_dir: created if needed; receives both graphs, config, generation config, tokenizer and manifest.
        dtype: "fp32" or "fp16" (fp16 weights, activations and KV cache; for GPU serving).
        quantize: None or "int8" (dynamic quantization of the fp32 graphs, CPU serving).
        opset: ONNX opset for the exporter.
        validate: compare onnxruntime with PyTorch on `validation_grid`; an fp32 export fails above `tolerance`.
        tokenizer_dir: where `tokenizer.json` lives; defaults to `model_dir`.
    """
    if dtype not in ("fp32", "fp16"):
        raise ValueError(f"dtype must be 'fp32' or 'fp16', got {dtype!r}")
    if quantize not in (None, "int8"):
        raise ValueError(f"quantize must be None or 'int8', got {quantize!r}")
    if dtype == "fp16" and quantize:
        raise ValueError("int8 quantization applies to fp32 graphs; do not combine it with dtype='fp16'")
    model_dir, output_dir = Path(model_dir), Path(output_dir)
    if not (model_dir / "config.json").is_file():
        raise ValueError(f"{model_dir} is not a saved model folder (no config.json)")
    output_dir.mkdir(parents=True, exist_ok=True)
    copy_tokenizer(Path(tokenizer_dir) if tokenizer_dir else model_dir, output_dir)

    from ..inference import load_model_folder
    from .onnx_validation import validate_export

    model = load_model_folder(model_dir, dtype=torch.float32).eval()
    export_graphs(model, output_dir, opset=opset)
    report: dict = {}
    if validate:
        report["fp32"] = validate_export(model, output_dir)
        worst = max(report["fp32"]["encoder"], report["fp32"]["logits"], report["fp32"]["present"])
        if worst > tolerance:
            raise ValueError(f"fp32 export differs from PyTorch by {worst:.3g} > tolerance {tolerance:g}")
    if dtype != "fp32" or quantize:
        optimize_variant(output_dir, dtype, quantize)
        if validate:
            report[quantize or dtype] = validate_export(model, output_dir)
    write_cache_reorder_graph(output_dir)
    write_beam_scores_graph(output_dir)
    model.config.save_pretrained(output_dir)
    model.generation_config.save_pretrained(output_dir)
    manifest = build_manifest(model.config, output_dir, dtype=dtype, quantize=quantize, opset=opset)
    if report:
        manifest["validation"] = {k: {kk: vv for kk, vv in v.items() if kk != "cases"} for k, v in report.items()}
        manifest["validation_cases"] = {k: v["cases"] for k, v in report.items()}
    (output_dir / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def build_manifest(config, output_dir: Path, *, dtype: str, quantize: str | None, opset: int) -> dict:
    """What was exported: format, opset, dtype, dimensions the runtime needs, graph I/O and file sizes."""
    import onnx

    files = {p.name: p.stat().st_size for p in sorted(output_dir.iterdir()) if p.is_file() and p.name != MANIFEST_FILE}
    return {
        "format": "vanilla-transformer-onnx",
        "format_version": 1,
        "opset": opset,
        "ir_version": onnx.load(str(output_dir / DECODER_FILE), load_external_data=False).ir_version,
        "dtype": dtype,
        "quantization": "int8-dynamic" if quantize == "int8" else None,
        "decoder_layers": config.decoder_layers,
        "decoder_attention_heads": config.decoder_attention_heads,
        "d_model": config.d_model,
        "vocab_size": config.vocab_size,
        "graphs": {
            name: _graph_io(output_dir / name) for name in (ENCODER_FILE, DECODER_FILE, REORDER_FILE, BEAM_SCORES_FILE)
        },
        "files": files,
    }
