"""The encoder and one-step decoder graphs: flat-tensor wrappers around the model, exported with torch.onnx (dynamo).

The graphs take and return flat tensors only (cache objects cannot be graph inputs); the wrappers rebuild the
`EncoderDecoderCache` inside `forward`, so no export hook leaks into the model layers. Graph names and I/O come from
`vanilla_transformer_ort.contract`; docs/onnx.md shows their shapes.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache, EncoderDecoderCache

from vanilla_transformer_ort.contract import (
    BATCH_DIM,
    DECODER_FILE,
    ENCODER_FILE,
    ENCODER_INPUTS,
    PAST_DIM,
    SOURCE_DIM,
    TARGET_DIM,
    decoder_input_names,
    decoder_output_names,
    encoder_output_names,
)

DEFAULT_OPSET = 20
# Sample sizes for tracing: all >= 2 and pairwise different, so torch.export specialises no dynamic dimension
# (torch.export treats a size of 0 or 1 as a constant and would freeze it into the graph).
TRACE_BATCH, TRACE_SOURCE_LEN, TRACE_TARGET_LEN, TRACE_PAST_LEN = 2, 7, 3, 5


class EncoderWithCrossKV(nn.Module):
    """Encoder plus the cross-attention keys/values of every decoder layer, computed once per source."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.encoder = model.model.encoder
        self.cross_attentions = nn.ModuleList(layer.encoder_attn for layer in model.model.decoder.layers)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask, return_dict=True).last_hidden_state
        outputs = [hidden]  # (batch, src_len, d_model)
        for attention in self.cross_attentions:
            # the projections and head split the attention layer applies to the encoder output at the first step
            outputs.append(attention.split_heads(attention.k_proj(hidden)))  # (batch, heads, src_len, d_head)
            outputs.append(attention.split_heads(attention.v_proj(hidden)))
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
    batch, src, tgt, past = BATCH_DIM, SOURCE_DIM, TARGET_DIM, PAST_DIM
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
    graphs = [
        (EncoderWithCrossKV(model), encoder_args, encoder_path, list(ENCODER_INPUTS), encoder_output_names(num_layers),
         encoder_shapes),
        (DecoderStep(model), decoder_args, decoder_path, decoder_input_names(num_layers),
         decoder_output_names(num_layers), decoder_shapes),
    ]  # fmt: skip
    with torch.no_grad():
        for module, args, path, input_names, output_names, dynamic_shapes in graphs:
            torch.onnx.export(
                module.eval(), args, path, dynamo=True, input_names=input_names, output_names=output_names,
                dynamic_shapes=dynamic_shapes, opset_version=opset, external_data=False,
            )  # fmt: skip
