"""Checks of the models' inputs at the package's edge: clear `ValueError`s instead of reshape or index errors from deep
inside torch. Not part of the paper; skipped while a graph is captured, where they would become guards.

Imports only torch and siblings, so that it can be shipped as remote code.
"""

import torch

from .kernels import is_tracing
from .loss import IGNORE_INDEX


def check_token_ids(name: str, ids: torch.Tensor | None, vocab_size: int, allow_ignore: bool = False) -> None:
    """A clear error for ids of the wrong type, rank or size, or outside the vocabulary; with `allow_ignore` (labels)
    `IGNORE_INDEX` is allowed too."""
    if ids is None or is_tracing():
        return
    if not isinstance(ids, torch.Tensor):
        raise ValueError(f"`{name}` must be a torch.LongTensor of shape (batch, length), got {type(ids).__name__}.")
    if ids.dim() != 2:
        raise ValueError(f"`{name}` must have shape (batch, length), got shape {tuple(ids.shape)}.")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ValueError(
            f"`{name}` is empty (shape {tuple(ids.shape)}): it needs at least one sequence of at least one token "
            "(the tokenizer adds </s> even to an empty sentence)."
        )
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ValueError(f"`{name}` must hold integer token ids, got dtype {ids.dtype}.")
    low, high = torch.aminmax(ids)  # one pass; this check runs at every decoding step
    if int(low) >= 0 and int(high) < vocab_size:
        return
    valid = (ids >= 0) & (ids < vocab_size)
    if allow_ignore:
        valid |= ids == IGNORE_INDEX
    if not bool(valid.all()):
        bad = ids[~valid]
        raise ValueError(
            f"`{name}` holds ids outside the vocabulary [0, {vocab_size}): e.g. {bad[:5].tolist()}"
            f"{f' ({IGNORE_INDEX} marks ignored labels)' if allow_ignore else ''}. Do the tokenizer and the model "
            f"config (vocab_size={vocab_size}) agree?"
        )


def check_mask(name: str, mask: torch.Tensor | None, batch_size: int, lengths: tuple[int, ...], of: str) -> None:
    """A 2D mask (1 = real token, 0 = padding) must have one row per sequence and one of the allowed `lengths`."""
    if mask is None or mask.dim() != 2 or is_tracing():  # 4D masks are passed through as the caller built them
        return
    if mask.shape[0] != batch_size or mask.shape[1] not in lengths:
        raise ValueError(
            f"`{name}` has shape {tuple(mask.shape)} but {of} needs (batch={batch_size}, length in {list(lengths)}): "
            f"one 1/0 entry per token (1 = real token, 0 = padding)."
        )


def check_batch_size(name: str, batch_size: int, expected: int, of: str, hint: str) -> None:
    """`name` must have as many rows as `of` (`expected`); `hint` says what the caller should pass."""
    if batch_size != expected and not is_tracing():
        raise ValueError(f"{name} has batch size {batch_size} but {of} {expected}: {hint}")
