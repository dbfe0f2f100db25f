"""The encoder and decoder layers (§3.1): attention and the position-wise feed-forward network (§3.3), each sub-layer
wrapped in a residual connection and layer normalization.

Imports only torch, transformers and sibling modules, so that it can be shipped as remote code.
"""

from collections.abc import Callable

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs

from .attention import MultiHeadAttention
from .kernels import Linear, dropout, relu_dropout


class ResidualLayerNorm(nn.LayerNorm):
    """LayerNorm(x + Dropout(Sublayer(x))), the connection around every sub-layer (§3.1, with the residual dropout
    of §5.4).

    It is the sub-layer's LayerNorm (a `nn.LayerNorm`, so its γ and β keep the state-dict keys `self_attn_layer_norm`,
    `encoder_attn_layer_norm` and `final_layer_norm`) that also applies the residual connection around the sub-layer
    it is given. With `normalize_before` the pre-LN form `x + Dropout(Sublayer(LayerNorm(x)))` is used instead.
    """

    def __init__(self, d_model: int, eps: float, dropout: float, normalize_before: bool = False):
        super().__init__(d_model, eps=eps)
        self.dropout = dropout  # P_drop
        self.normalize_before = normalize_before

    def forward(self, hidden_states: torch.Tensor, sublayer: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """hidden_states: (batch, len, d_model); `sublayer` maps (batch, len, d_model) to the same shape."""
        if self.normalize_before:
            # Deviation from paper: pre-LN (Wang et al., 2019), opt-in, for deep stacks and fp16 training.
            normalized = super().forward(hidden_states)
            return hidden_states + dropout(sublayer(normalized), self.dropout, self.training)
        return super().forward(hidden_states + dropout(sublayer(hidden_states), self.dropout, self.training))


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, the same two projections applied to each position separately (§3.3).

    This module holds the activation and its dropout; W1, b1 and W2, b2 are the layer's own `fc1` and `fc2`, passed
    in at each call. They stay direct children of the layer because their state-dict keys (`layers.N.fc1.weight`)
    are the checkpoint format shared with Marian and BART, the converters and the exporters. Passing them rather than
    keeping references here means there is one owner and nothing to keep in sync: a deepcopy, `.to()`, FSDP wrapping,
    or tools that replace the layer's `fc1`/`fc2` modules (quantization, adapters) are seen at the next call, and
    torch.compile and activation checkpointing see a plain function of the layer's modules.
    """

    def __init__(self, activation_function: str = "relu", activation_dropout: float = 0.0):
        super().__init__()
        self.activation_fn = ACT2FN[activation_function]  # max(0, ·) for the paper's "relu"
        self.is_relu = activation_function == "relu"
        self.activation_dropout = activation_dropout  # not in the paper: 0 by default

    def forward(self, hidden_states: torch.Tensor, fc1: nn.Linear, fc2: nn.Linear) -> torch.Tensor:
        """hidden_states: (batch, len, d_model) → (batch, len, d_model), through (batch, len, d_ff)."""
        if self.is_relu:  # max(0, ·) and its dropout as one step (`kernels.relu_dropout`)
            hidden = relu_dropout(fc1(hidden_states), self.activation_dropout, self.training)  # (batch, len, d_ff)
        else:
            hidden = self.activation_fn(fc1(hidden_states))  # (batch, len, d_ff)
            hidden = dropout(hidden, self.activation_dropout, self.training)
        return fc2(hidden)  # (batch, len, d_model)


class TransformerLayer(GradientCheckpointingLayer):
    """What the encoder and decoder layers share (§3.1): self-attention, in the decoder cross-attention over the
    encoder output, and the FFN, each followed by its `ResidualLayerNorm`.

    The submodules are registered in the order the sub-layers run, which is also the order of their state-dict keys.
    """

    def __init__(self, config, num_heads: int, d_ff: int, layer_idx: int | None, is_decoder: bool):
        super().__init__()
        d_model = config.d_model

        def attention(is_causal: bool = False) -> MultiHeadAttention:
            return MultiHeadAttention(
                config, d_model, num_heads, config.attention_dropout, is_causal=is_causal, layer_idx=layer_idx
            )

        def residual_layer_norm() -> ResidualLayerNorm:
            return ResidualLayerNorm(d_model, config.layer_norm_eps, config.dropout, config.normalize_before)

        self.self_attn = attention(is_causal=is_decoder)  # the decoder's is masked (§3.2.3)
        self.self_attn_layer_norm = residual_layer_norm()
        if is_decoder:  # "a third sub-layer, which performs multi-head attention over the output of the encoder stack"
            self.encoder_attn = attention()
            self.encoder_attn_layer_norm = residual_layer_norm()
        self.feed_forward = PositionwiseFeedForward(config.activation_function, config.activation_dropout)
        self.fc1 = Linear(d_model, d_ff)  # W1, b1
        self.fc2 = Linear(d_ff, d_model)  # W2, b2
        self.final_layer_norm = residual_layer_norm()

    def ffn(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The FFN sub-layer (§3.3) with this layer's projections."""
        return self.feed_forward(hidden_states, self.fc1, self.fc2)


class EncoderLayer(TransformerLayer):
    """Self-attention, then the position-wise FFN, each in a residual block (§3.1, Figure 1 left)."""

    def __init__(self, config, layer_idx: int | None = None):
        super().__init__(config, config.encoder_attention_heads, config.encoder_ffn_dim, layer_idx, is_decoder=False)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        """hidden_states: (batch, src_len, d_model) → (batch, src_len, d_model); attention_mask as built by
        `create_bidirectional_mask` for the attention backend."""
        hidden_states = self.self_attn_layer_norm(
            hidden_states, lambda x: self.self_attn(x, attention_mask=attention_mask, **kwargs)[0]
        )
        return self.final_layer_norm(hidden_states, self.ffn)


class DecoderLayer(TransformerLayer):
    """Causal self-attention, cross-attention over the encoder output, then the FFN (§3.1, Figure 1 right)."""

    def __init__(self, config, layer_idx: int | None = None):
        super().__init__(config, config.decoder_attention_heads, config.decoder_ffn_dim, layer_idx, is_decoder=True)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        """hidden_states: (batch, tgt_len, d_model) → (batch, tgt_len, d_model); encoder_hidden_states:
        (batch, src_len, d_model); the masks as built by `create_causal_mask` / `create_bidirectional_mask`."""
        hidden_states = self.self_attn_layer_norm(
            hidden_states, lambda x: self.self_attn(x, attention_mask=attention_mask, cache=cache, **kwargs)[0]
        )
        hidden_states = self.encoder_attn_layer_norm(
            hidden_states,
            lambda x: self.encoder_attn(
                x, key_value_states=encoder_hidden_states, attention_mask=encoder_attention_mask, cache=cache, **kwargs
            )[0],
        )
        return self.final_layer_norm(hidden_states, self.ffn)
