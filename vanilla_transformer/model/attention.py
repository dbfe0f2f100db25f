"""Scaled dot-product attention (Eq. 1) and multi-head attention (§3.2.2).

`MultiHeadAttention` dispatches to transformers' attention interface (eager, sdpa, flex, flash), so the backend is
chosen with `attn_implementation` like any transformers model; `eager_attention_forward` is the paper's formula and
the fallback. Imports only torch, transformers and a sibling (`kernels.Linear`), so that it can be shipped as remote
code.
"""

from collections.abc import Callable

import torch
from torch import nn
from transformers.cache_utils import Cache, EncoderDecoderCache
from transformers.modeling_flash_attention_utils import FlashAttentionKwargs
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs

from .kernels import Linear, attention


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Unpack[TransformersKwargs],
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(Q Kᵀ / √d_k) V, paper Eq. (1), with transformers' attention-interface contract.

    Args:
        query: (batch, heads, tgt_len, d_k)
        key, value: (batch, heads, src_len, d_k)
        attention_mask: additive float mask (0 = attend, large negative = masked) or bool mask (True = attend),
            broadcastable to (batch, heads, tgt_len, src_len); None attends everywhere.
        scaling: 1 / √d_k.
    Returns:
        output (batch, tgt_len, heads, d_k) and weights (batch, heads, tgt_len, src_len).
    """
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # (batch, heads, tgt_len, src_len)
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask
    weights = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value)  # (batch, heads, tgt_len, d_k)
    return output.transpose(1, 2).contiguous(), weights  # (batch, tgt_len, heads, d_k)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V) (§3.2.2).

    The h projections of width d_k = d_model / h are computed as one (d_model, d_model) matrix per role
    (`q_proj`, `k_proj`, `v_proj`), as Marian and BART store them; `out_proj` is W^O.

    Three uses (§3.2.3): encoder self-attention, decoder causal self-attention (`is_causal=True`), and decoder
    cross-attention over the encoder output (`key_value_states` given). With an `EncoderDecoderCache` the decoder's
    self-attention keys/values grow by the new tokens at each step, and the cross-attention keys/values are projected
    once per source and then read back from the cache.
    """

    def __init__(
        self,
        config,
        d_model: int,
        num_heads: int,
        dropout: float = 0.0,
        is_causal: bool = False,
        layer_idx: int | None = None,
    ):
        super().__init__()
        if d_model % num_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads}).")
        self.config = config
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads  # d_k = d_v
        self.scaling = self.head_dim**-0.5  # 1 / √d_k
        self.dropout = dropout
        self.is_causal = is_causal  # read by the sdpa and flash backends when no mask is given
        self.layer_idx = layer_idx

        self.q_proj = Linear(d_model, d_model)
        self.k_proj = Linear(d_model, d_model)
        self.v_proj = Linear(d_model, d_model)
        self.out_proj = Linear(d_model, d_model)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """One projection's output as h heads of d_k (§3.2.2); the ONNX encoder graph reuses it for cross-attention."""
        # (batch, len, d_model) -> (batch, len, heads, d_k) -> (batch, heads, len, d_k)
        return x.view(*x.shape[:-1], -1, self.head_dim).transpose(1, 2)

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs: Unpack[FlashAttentionKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """hidden_states: (batch, tgt_len, d_model) queries (and keys/values for self-attention);
        key_value_states: (batch, src_len, d_model) encoder output for cross-attention.
        Returns the (batch, tgt_len, d_model) output and the attention weights (eager only, else None)."""
        is_cross_attention = key_value_states is not None
        query = self.split_heads(self.q_proj(hidden_states))  # (batch, heads, tgt_len, d_k)

        sub_cache, cross_is_cached = cache, False
        if isinstance(cache, EncoderDecoderCache):
            sub_cache = cache.cross_attention_cache if is_cross_attention else cache.self_attention_cache
            cross_is_cached = is_cross_attention and bool(cache.is_updated.get(self.layer_idx))

        if cross_is_cached:
            # The source's keys/values were projected at the first decoding step.
            key = sub_cache.layers[self.layer_idx].keys
            value = sub_cache.layers[self.layer_idx].values
        else:
            source = key_value_states if is_cross_attention else hidden_states
            key = self.split_heads(self.k_proj(source))  # (batch, heads, src_len, d_k)
            value = self.split_heads(self.v_proj(source))
            if sub_cache is not None:
                key, value = sub_cache.update(key, value, self.layer_idx)
                if is_cross_attention and isinstance(cache, EncoderDecoderCache):
                    cache.is_updated[self.layer_idx] = True

        implementation = self.config._attn_implementation
        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        output, weights = attention(
            attention_interface,
            self,
            query,
            key,
            value,
            attention_mask,
            # Under CPU autocast the sdpa and eager backends run as this formula in bf16 (kernels.attention).
            math=eager_attention_forward if implementation in (None, "eager", "sdpa") else None,
            dropout=self.dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        output = output.reshape(*hidden_states.shape[:-1], -1).contiguous()  # (batch, tgt_len, heads * d_k)
        return self.out_proj(output), weights
