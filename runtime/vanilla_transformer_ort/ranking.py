"""The ranking arithmetic of the searches (`search.py`) in numpy: log-softmax, the k best of a row with
transformers' tie order, and the gathering of beams."""

from __future__ import annotations

import numpy as np


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float32, computed in place (`logits` is overwritten and returned)."""
    shifted = np.subtract(logits, logits.max(axis=-1, keepdims=True), out=logits)
    return np.subtract(shifted, np.log(np.exp(shifted).sum(axis=-1, keepdims=True)), out=shifted)


# Rows longer than this are searched block by block (see `top_k`).
TOP_K_BLOCK = 256


def _ranked(values: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k largest values per row, descending; ties keep their order in the row.

    Wide rows are partitioned first and only the k chosen are sorted; rows where a tie straddles the k-th place
    (which partitioning would settle arbitrarily) are sorted whole, stably.
    """
    if values.shape[1] <= 4 * k:
        return np.argsort(-values, axis=1, kind="stable")[:, :k]
    chosen = np.argpartition(-values, k - 1, axis=1)[:, :k]
    chosen_values = np.take_along_axis(values, chosen, axis=1)
    order = np.lexsort((chosen, -chosen_values), axis=1)
    ranked = np.take_along_axis(chosen, order, axis=1)
    kth = chosen_values.min(axis=1, keepdims=True)
    tied = np.flatnonzero((values >= kth).sum(axis=1) > k)
    if tied.size:
        ranked[tied] = np.argsort(-values[tied], axis=1, kind="stable")[:, :k]
    return ranked


def top_k(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the k largest values in descending order (ties: lower index first) and their indices.

    Long rows (beam search ranks num_beams x vocab scores per sentence) are searched in blocks of `TOP_K_BLOCK`: the
    k largest values of a row lie in the k blocks with the largest maxima (ranked by maximum, then position), so only
    the elements of those blocks, plus the tail that fills no whole block, are sorted. Exact, ties included: every
    block ranked before the block of a top-k element holds a distinct element ranked before it.
    """
    rows, length = scores.shape
    k = min(k, length)
    blocks = length // TOP_K_BLOCK
    if blocks <= 2 * k:
        order = _ranked(scores, k)
        return np.take_along_axis(scores, order, axis=1), order
    body = blocks * TOP_K_BLOCK
    maxima = scores[:, :body].reshape(rows, blocks, TOP_K_BLOCK).max(axis=2)  # (rows, blocks)
    best_blocks = np.sort(_ranked(maxima, k), axis=1)  # ascending, so candidates stay in index order
    candidates = (best_blocks[:, :, None] * TOP_K_BLOCK + np.arange(TOP_K_BLOCK)).reshape(rows, -1)
    if body < length:
        tail = np.broadcast_to(np.arange(body, length), (rows, length - body))
        candidates = np.concatenate([candidates, tail], axis=1)
    values = np.take_along_axis(scores, candidates, axis=1)
    order = _ranked(values, k)
    return np.take_along_axis(values, order, axis=1), np.take_along_axis(candidates, order, axis=1)


def gather(array: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """array (batch, beams, ...) gathered on the beam axis with indices (batch, k): (batch, k, ...).

    Plain advanced indexing, as `np.take_along_axis(array, indices[..., None, ...], axis=1)` computes it, without
    the index arrays that function builds and checks on every call (a search step gathers seven times)."""
    rows = np.arange(indices.shape[0])[:, None]  # (batch, 1), broadcast against (batch, k)
    return array[rows, indices]
