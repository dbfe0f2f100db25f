"""The one fixed difference between MarianMT and the paper's layout (§3.5): Marian's sinusoids put all sines in the
first half of the vector and all cosines in the second; the paper (and this package) interleave them at the same
frequencies. The two layouts differ by a permutation of the model dimension, so the import and the export permute the
residual stream (every d_model axis of the weights) instead of the positional encoding, which leaves the logits
unchanged.
"""

from __future__ import annotations

import torch


def interleave_permutation(d_model: int) -> torch.Tensor:
    """Indices `perm` with `ours[..., k] = marian[..., perm[k]]`: [sin | cos] halves → interleaved sin/cos pairs.

    Our dimension 2i holds sin(pos·ω_i), Marian's dimension i; our 2i+1 holds cos(pos·ω_i), Marian's d_model/2 + i.
    """
    half = d_model // 2
    return torch.stack((torch.arange(half), torch.arange(half) + half), dim=1).flatten()  # (d_model,)


def permute_residual(name: str, tensor: torch.Tensor, perm: torch.Tensor) -> tuple[torch.Tensor, str]:
    """Tensor `name` (a MarianMTModel / this model's state-dict key) with its residual-stream axes reordered by
    `perm`, and a description of what was done: `interleave_permutation` imports Marian's layout, its `argsort`
    exports to it."""
    if name == "final_logits_bias":
        return tensor, "final_logits_bias: copied"
    base, kind = name.rsplit(".", 1)
    if name.endswith(("embed_tokens.weight", "shared.weight", "lm_head.weight")):
        return tensor[:, perm], "embedding / output projection: d_model columns permuted"
    if base.endswith(("q_proj", "k_proj", "v_proj", "fc1")):
        if kind == "weight":  # reads the residual stream: (out, d_model)
            return tensor[:, perm], "projection from d_model: input columns permuted"
        return tensor, "projection bias (not in d_model): copied"
    if base.endswith(("out_proj", "fc2")):  # writes the residual stream: (d_model, in) and (d_model,)
        if kind == "weight":
            return tensor[perm, :], "projection to d_model: output rows permuted"
        return tensor[perm], "projection bias in d_model: permuted"
    if base.endswith("layer_norm"):
        return tensor[perm], "LayerNorm γ/β: permuted"
    raise ValueError(f"No conversion rule for Marian tensor {name!r}.")
