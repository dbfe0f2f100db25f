"""The encoder and decoder layers (§3.1) with their position-wise feed-forward networks (§3.3).

Every sub-layer is wrapped in a residual block. The paper's post-LN form is `LayerNorm(x + Dropout(Sublayer(x)))`;
with `config.normalize_before` the pre-LN form `x + Dropout(Sublayer(LayerNorm(x)))` is used instead.
Imports only torch, transformers and sibling modules, so that it can be shipped as remote code.
"""

from collections.abc import Callable

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache
from transformers.modeling_layers import GradientCheckpointingLayer

from .attention import MultiHeadAttention
from .kernels import Linear, dropout


class ResidualBlockMixin:
    """The residual connection around each sub-layer (§3.1, §5.4)."""

    dropout: float
    normalize_before: bool
    training: bool

    def residual(
        self, x: torch.Tensor, layer_norm: nn.LayerNorm, sublayer: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        if self.normalize_before:
            # Deviation from paper: pre-LN (Wang et al., 2019), opt-in, for deep stacks and fp16 training.
            return x + dropout(sublayer(layer_norm(x)), self.dropout, self.training)
        return layer_norm(x + dropout(sublayer(x), self.dropout, self.training))

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        """FFN(x) = max(0, x W1 + b1) W2 + b2, applied to each position separately (§3.3)."""
        hidden = self.activation_fn(self.fc1(x))  # (batch, len, d_ff)
        hidden = dropout(hidden, self.activation_dropout, self.training)
        return self.fc2(hidden)


class EncoderLayer(ResidualBlockMixin, GradientCheckpointingLayer):
    """Self-attention, then the position-wise FFN, each in a residual block (§3.1, Figure 1 left)."""

    def __init__(self, config, layer_idx: int | None = None):
        super().__init__()
        d_model = config.d_model
        self.dropout = config.dropout
        self.activation_dropout = config.activation_dropout
        self.normalize_before = config.normalize_before
        self.self_attn = MultiHeadAttention(
            config, d_model, config.encoder_attention_heads, config.attention_dropout, layer_idx=layer_idx
        )
        self.self_attn_layer_norm = nn.LayerNorm(d_model, eps=config.layer_norm_eps)
        self.activation_fn = ACT2FN[config.activation_function]
        self.fc1 = Linear(d_model, config.encoder_ffn_dim)  # W1, b1
        self.fc2 = Linear(config.encoder_ffn_dim, d_model)  # W2, b2
        self.final_layer_norm = nn.LayerNorm(d_model, eps=config.layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        """hidden_states: (batch, src_len, d_model) → (batch, src_len, d_model)."""
        hidden_states = self.residual(
            hidden_states,
            self.self_attn_layer_norm,
            lambda x: self.self_attn(x, attention_mask=attention_mask, **kwargs)[0],
        )
        return self.residual(hidden_states, self.final_layer_norm, self.feed_forward)


class DecoderLayer(ResidualBlockMixin, GradientCheckpointingLayer):
    """Causal self-attention, cross-attention over the encoder output, then the FFN (§3.1, Figure 1 right)."""

    def __init__(self, config, layer_idx: int | None = None):
        super().__init__()
        d_model = config.d_model
        heads = config.decoder_attention_heads
        self.dropout = config.dropout
        self.activation_dropout = config.activation_dropout
        self.normalize_before = config.normalize_before
        self.self_attn = MultiHeadAttention(
            config, d_model, heads, config.attention_dropout, is_causal=True, layer_idx=layer_idx
        )
        self.self_attn_layer_norm = nn.LayerNorm(d_model, eps=config.layer_norm_eps)
        self.encoder_attn = MultiHeadAttention(config, d_model, heads, config.attention_dropout, layer_idx=layer_idx)
        self.encoder_attn_layer_norm = nn.LayerNorm(d_model, eps=config.layer_norm_eps)
        self.activation_fn = ACT2FN[config.activation_function]
        self.fc1 = Linear(d_model, config.decoder_ffn_dim)
        self.fc2 = Linear(config.decoder_ffn_dim, d_model)
        self.final_layer_norm = nn.LayerNorm(d_model, eps=config.layer_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = True,
        **kwargs,
    ) -> torch.Tensor:
        """hidden_states: (batch, tgt_len, d_model); encoder_hidden_states: (batch, src_len, d_model)."""
        hidden_states = self.residual(
            hidden_states,
            self.self_attn_layer_norm,
            lambda x: self.self_attn(x, attention_mask=attention_mask, cache=cache, **kwargs)[0],
        )
        hidden_states = self.residual(
            hidden_states,
            self.encoder_attn_layer_norm,
            lambda x: self.encoder_attn(
                x, key_value_states=encoder_hidden_states, attention_mask=encoder_attention_mask, cache=cache, **kwargs
            )[0],
        )
        return self.residual(hidden_states, self.final_layer_norm, self.feed_forward)
