"""Input representation of both stacks: token embeddings × √d_model plus sinusoidal positional encodings, then
dropout (§3.4, §3.5, §5.4).

Imports only torch and a sibling (`kernels`), so that it can be shipped as remote code next to a checkpoint.
"""

import math

import torch
from torch import nn

from .kernels import dropout, is_tracing


def sinusoidal_positional_encoding(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """The positional encoding of §3.5, in closed form for any position (no table, so no length limit).

        PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
        PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))

    Sine and cosine are interleaved on even and odd dimensions, as the paper writes them (tensor2tensor, fairseq and
    Marian concatenate them instead, so their weights are not interchangeable with ours).

    Args:
        positions: (..., seq_len) integer or float positions, 0 for the first token.
        d_model: the (even) model width.
    Returns:
        (..., seq_len, d_model) float32 encodings.
    """
    if d_model % 2 != 0:
        raise ValueError(f"d_model must be even for sin/cos pairs, got {d_model}.")
    two_i = torch.arange(0, d_model, 2, dtype=torch.float32, device=positions.device)  # (d_model/2,)
    inv_freq = torch.exp(two_i * (-math.log(10000.0) / d_model))  # 1 / 10000^(2i/d_model)
    angles = positions.to(torch.float32).unsqueeze(-1) * inv_freq  # (..., seq_len, d_model/2)
    # (..., seq_len, d_model/2, 2) -> (..., seq_len, d_model): sin at 2i, cos at 2i+1
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)


class SinusoidalPositionalEncoding(nn.Module):
    """PE of §3.5 for the positions `offset, offset + 1, ...`; holds no parameters or buffers.

    `offset` is the number of tokens already decoded (the cache length), so step t of incremental decoding gets
    the same encoding as position t of a full forward pass.

    Eager calls with an integer offset read rows of a table of the closed form, computed once per device and
    doubled whenever a later position is asked for (so there is still no length limit): a decoding step then costs
    one slice instead of the sin/cos kernels. The table is a plain attribute, not a buffer, so it is never saved or
    loaded; compiled and exported graphs, and tensor offsets (static caches), compute the closed form inline.
    """

    def __init__(self, d_model: int):
        super().__init__()
        self.d_model = d_model
        self._tables: dict[torch.device, torch.Tensor] = {}  # device -> (table_len, d_model) float32

    def forward(
        self, seq_len: int, offset: int | torch.Tensor = 0, device: torch.device | None = None
    ) -> torch.Tensor:
        """Returns (seq_len, d_model) float32 encodings; callers must not modify them in place."""
        if isinstance(offset, torch.Tensor) or is_tracing():
            positions = torch.arange(seq_len, device=device) + offset  # (seq_len,)
            return sinusoidal_positional_encoding(positions, self.d_model)
        device = torch.device("cpu") if device is None else torch.device(device)
        end = offset + seq_len
        table = self._tables.get(device)
        if table is None or table.shape[0] < end:
            table_len = max(end, 256, 2 * table.shape[0] if table is not None else 0)
            table = sinusoidal_positional_encoding(torch.arange(table_len, device=device), self.d_model)
            self._tables[device] = table
        return table[offset:end]  # (seq_len, d_model)


class InputRepresentation(nn.Module):
    """Dropout(E[x] · √d_model + PE), the input of the first layer of either stack (§3.4, §3.5, §5.4).

    The embedding lookup E[x] itself stays with the stack (`embed_tokens`, whose weight is the shared matrix of §3.4
    and a state-dict key), so that callers may pass `inputs_embeds` instead of ids; this module holds no parameters.
    """

    def __init__(self, d_model: int, scale_embedding: bool = True, dropout: float = 0.0):
        super().__init__()
        self.embed_scale = math.sqrt(d_model) if scale_embedding else 1.0  # √d_model (§3.4)
        self.embed_positions = SinusoidalPositionalEncoding(d_model)
        self.dropout = dropout  # P_drop

    def forward(self, inputs_embeds: torch.Tensor, offset: int | torch.Tensor = 0) -> torch.Tensor:
        """inputs_embeds: (batch, len, d_model) embeddings E[x] of the tokens at positions offset, offset + 1, ...
        (offset = the number of tokens already decoded) → (batch, len, d_model)."""
        positions = self.embed_positions(inputs_embeds.shape[1], offset=offset, device=inputs_embeds.device)
        hidden_states = inputs_embeds * self.embed_scale + positions.to(inputs_embeds.dtype)  # (batch, len, d_model)
        return dropout(hidden_states, self.dropout, self.training)
