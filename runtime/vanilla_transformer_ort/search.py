"""Greedy and beam search in numpy, with transformers' `generate()` semantics (v5.24), for any step function.

The decoder is abstracted as a `DecoderState`: `step(last_tokens)` returns next-token logits and advances the cache,
`reorder(rows)` keeps the given cache rows (beam reordering). Scores are kept in float32 like transformers does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

# transformers' "minus infinity" for beam bookkeeping (a finite constant, kept as is to reproduce its arithmetic).
LARGE_NEGATIVE = np.float32(-1.0e9)


class DecoderState(Protocol):
    """One decoding run's cache, as the searches below drive it.

    `vocab_size` is the width of the logits. `ranks_candidates` says whether `step_top_k` is available (the exported
    `beam_scores.onnx` ranks a beam step's candidates in onnxruntime, next to the logits); when it is False, beam
    search calls `step` and ranks in numpy.
    """

    vocab_size: int

    @property
    def ranks_candidates(self) -> bool: ...

    def step(self, last_tokens: np.ndarray) -> np.ndarray:
        """(rows, 1) int64 -> (rows, vocab) float32 logits of the next token."""

    def step_top_k(
        self, last_tokens: np.ndarray, running_scores: np.ndarray, bias: np.ndarray, batch_size: int, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Advance like `step`; return the k largest of `log_softmax(logits) + bias + running_scores` per sentence
        over its num_beams x vocab candidates, descending, ties to the lower index: values (batch, k) float32 and
        flat indices (batch, k) int64. `running_scores` is (rows, 1), `bias` (vocab,)."""

    def reorder(self, rows: np.ndarray) -> None:
        """Keep cache rows `rows` (int64, length rows) in that order."""

    def keep_rows(self, rows: np.ndarray) -> None:
        """Drop every row but `rows` (int64, ascending) from the cache, the cross-attention K/V and the source mask:
        the searches call it when sentences finish, so that a batch costs what its unfinished sentences cost. A
        state without it (`getattr(state, "keep_rows", None) is None`) keeps computing finished rows."""


@dataclass
class GenerationSettings:
    """The subset of `transformers.GenerationConfig` this runtime implements, with the same meanings.

    `max_new_tokens` counts generated tokens (EOS included); `min_new_tokens` bans EOS before that many;
    `length_penalty` divides a finished beam's summed log-probabilities by generated_length ** length_penalty;
    `early_stopping` is True, False or "never" exactly as in transformers; `banned_token_ids` are never generated
    (transformers' `bad_words_ids` of one token each, e.g. Marian's pad); `renormalize_logits` applies log-softmax
    again after these changes, as transformers' `renormalize_logits=True` does.
    """

    decoder_start_token_id: int
    eos_token_ids: list[int] = field(default_factory=list)
    pad_token_id: int | None = None
    max_new_tokens: int = 19
    min_new_tokens: int = 0
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    forced_eos_token_id: int | None = None
    banned_token_ids: list[int] = field(default_factory=list)
    renormalize_logits: bool = False

    def validate(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.num_beams < 1:
            raise ValueError(f"num_beams must be >= 1, got {self.num_beams}")
        if self.early_stopping not in (True, False, "never"):
            raise ValueError(f"early_stopping must be True, False or 'never', got {self.early_stopping!r}")
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(f"min_new_tokens ({self.min_new_tokens}) > max_new_tokens ({self.max_new_tokens})")


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float32, computed in place (`logits` is overwritten and returned)."""
    shifted = np.subtract(logits, logits.max(axis=-1, keepdims=True), out=logits)
    return np.subtract(shifted, np.log(np.exp(shifted).sum(axis=-1, keepdims=True)), out=shifted)


def process_scores(scores: np.ndarray, cur_len: int, settings: GenerationSettings) -> np.ndarray:
    """transformers' bad-words (single tokens), min-length, forced-EOS and renormalization processors, in that
    order, in place; `cur_len` counts the decoder start token."""
    max_length = settings.max_new_tokens + 1
    if settings.banned_token_ids:
        scores[:, settings.banned_token_ids] = -np.inf
    if settings.eos_token_ids and cur_len < settings.min_new_tokens + 1:
        scores[:, settings.eos_token_ids] = -np.inf
    if settings.forced_eos_token_id is not None and cur_len == max_length - 1:
        scores = np.full_like(scores, -np.inf)
        scores[:, settings.forced_eos_token_id] = 0
    if settings.renormalize_logits:
        scores = log_softmax(scores)
    return scores


def score_bias(cur_len: int, settings: GenerationSettings, vocab_size: int) -> np.ndarray | None:
    """`process_scores` as an additive (vocab,) float32 bias, 0 or -inf, or None where it is not one (forced EOS).

    Adding -inf equals setting -inf, and adding 0 changes nothing, so `scores + bias == process_scores(scores)`.
    Renormalization is not additive either (None).
    """
    if settings.renormalize_logits:
        return None
    if settings.forced_eos_token_id is not None and cur_len == settings.max_new_tokens:
        return None
    bias = np.zeros(vocab_size, dtype=np.float32)
    if settings.banned_token_ids:
        bias[settings.banned_token_ids] = -np.inf
    if settings.eos_token_ids and cur_len < settings.min_new_tokens + 1:
        bias[settings.eos_token_ids] = -np.inf
    return bias


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


def greedy_search(state: DecoderState, batch_size: int, settings: GenerationSettings) -> np.ndarray:
    """Greedy decoding; returns (batch, 1 + generated) int64 with the start token first, finished rows pad-filled.

    A finished row leaves the decoder's batch (where the state can `keep_rows`): it would only produce padding.
    """
    tokens = np.full((batch_size, 1), settings.decoder_start_token_id, dtype=np.int64)
    unfinished = np.ones(batch_size, dtype=bool)
    pad = settings.pad_token_id
    if pad is None:  # transformers falls back to the first EOS id
        pad = settings.eos_token_ids[0] if settings.eos_token_ids else 0
    prune = getattr(state, "keep_rows", None)
    active = np.arange(batch_size)  # the rows the state holds, in its order
    for _ in range(settings.max_new_tokens):
        scores = process_scores(state.step(tokens[active, -1:]), tokens.shape[1], settings)
        next_tokens = np.full(batch_size, pad, dtype=np.int64)
        next_tokens[active] = scores.argmax(axis=-1)
        if settings.eos_token_ids:
            next_tokens = np.where(unfinished, next_tokens, pad)
            unfinished &= ~np.isin(next_tokens, settings.eos_token_ids)
        tokens = np.concatenate([tokens, next_tokens[:, None]], axis=1)
        if not unfinished.any():
            break
        if prune is not None and not unfinished[active].all():
            prune(np.flatnonzero(unfinished[active]))
            active = active[unfinished[active]]
    return tokens


def _output_fill_value(settings: GenerationSettings) -> int:
    # transformers fills beam outputs with `pad_token_id or eos_token_id[0]`: a pad id of 0 is falsy there,
    # so with pad 0 the unused tail of shorter hypotheses holds EOS. Reproduced for token-identical outputs.
    if not settings.eos_token_ids:
        return -1
    return settings.pad_token_id or settings.eos_token_ids[0]


def _gather(array: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """array (batch, beams, ...) gathered on the beam axis with indices (batch, k): (batch, k, ...).

    Plain advanced indexing, as `np.take_along_axis(array, indices[..., None, ...], axis=1)` computes it, without
    the index arrays that function builds and checks on every call (a search step gathers seven times)."""
    rows = np.arange(indices.shape[0])[:, None]  # (batch, 1), broadcast against (batch, k)
    return array[rows, indices]


def beam_search(state: DecoderState, batch_size: int, settings: GenerationSettings) -> np.ndarray:
    """Beam search returning the best hypothesis per row: (batch, 1 + longest) int64, like `generate()`.

    `state` must hold batch * num_beams rows (each source repeated num_beams times, adjacent). A state that
    `ranks_candidates` ranks them itself with `step_top_k` (the exported `beam_scores.onnx`); otherwise numpy does.
    """
    num_beams = settings.num_beams
    max_length = settings.max_new_tokens + 1
    prompt_len = 1
    eos = np.asarray(settings.eos_token_ids, dtype=np.int64)
    beams_to_keep = max(2, 1 + len(eos)) * num_beams
    top_num_beam_mask = np.arange(beams_to_keep) < num_beams
    penalty, early = settings.length_penalty, settings.early_stopping

    running = np.full((batch_size, num_beams, max_length), _output_fill_value(settings), dtype=np.int64)
    running[:, :, 0] = settings.decoder_start_token_id
    sequences = running.copy()
    running_scores = np.zeros((batch_size, num_beams), dtype=np.float32)
    running_scores[:, 1:] = LARGE_NEGATIVE  # only the first beam expands at step one
    beam_scores = np.full((batch_size, num_beams), LARGE_NEGATIVE, dtype=np.float32)
    finished = np.zeros((batch_size, num_beams), dtype=bool)
    may_improve = np.ones((batch_size, 1), dtype=bool)
    running_origin = np.full((batch_size, num_beams, max_length - prompt_len), -1, dtype=np.int64)
    origin = running_origin.copy()
    batch_offset = (np.arange(batch_size) * num_beams)[:, None]

    # Sentences still searched, in the state's order; a sentence whose result can no longer change leaves the
    # decoder's batch (where the state can `keep_rows`). Its arrays below keep their final values, so the outputs are
    # those of searching every sentence to the end, as transformers does.
    prune = getattr(state, "keep_rows", None)
    active = np.arange(batch_size)
    cur_len = prompt_len
    while True:
        n = active.size
        last = running[active, :, cur_len - 1].reshape(-1, 1)
        # a-b. log-probabilities, logit processors, plus the running scores; the top 2 x num_beams per sentence
        bias = score_bias(cur_len, settings, state.vocab_size) if state.ranks_candidates else None
        if bias is not None:
            vocab = state.vocab_size
            running_column = running_scores[active].reshape(-1, 1)
            topk_scores, topk_indices = state.step_top_k(last, running_column, bias, n, beams_to_keep)
        else:
            log_probs = process_scores(log_softmax(state.step(last)), cur_len, settings)  # (n * beams, vocab)
            vocab = log_probs.shape[-1]
            log_probs += running_scores[active].reshape(-1, 1)
            topk_scores, topk_indices = top_k(log_probs.reshape(n, num_beams * vocab), beams_to_keep)

        # c. the top continuations over all beams of a sentence. Every hypothesis holds its fill value beyond
        # position cur_len (origins: beyond cur_len - prompt_len), so only the columns up to there are gathered.
        source_beam, token = topk_indices // vocab, topk_indices % vocab
        width, steps = cur_len + 1, cur_len + 1 - prompt_len
        topk_sequences = _gather(running[active, :, :width], source_beam)
        topk_sequences[:, :, cur_len] = token
        topk_origin = _gather(running_origin[active, :, :steps], source_beam)
        topk_origin[:, :, cur_len - prompt_len] = source_beam + batch_offset[:n]  # rows of the state as it is

        # d. which continuations stop here (EOS, or maximum length)
        hits = (token[..., None] == eos).any(axis=-1) | (cur_len + 1 >= max_length)  # np.isin, for a few ids

        # e. the best unfinished continuations keep running
        open_scores = topk_scores + hits.astype(np.float32) * LARGE_NEGATIVE
        keep = top_k(open_scores, num_beams)[1]
        running[active, :, :width], running_scores[active] = _gather(topk_sequences, keep), _gather(open_scores, keep)
        running_origin[active, :, :steps] = _gather(topk_origin, keep)

        # f. finished candidates among the top num_beams compete with the finished set, length-penalised
        just_finished = hits & top_num_beam_mask[None, :]
        final_scores = topk_scores / np.float32((cur_len + 1 - prompt_len) ** penalty)
        full = finished[active].all(axis=1, keepdims=True) & (early is True)
        final_scores = final_scores + full.astype(np.float32) * LARGE_NEGATIVE
        final_scores = final_scores + (~may_improve[active]).astype(np.float32) * LARGE_NEGATIVE
        final_scores = final_scores + (~just_finished).astype(np.float32) * LARGE_NEGATIVE
        merged_scores = np.concatenate([beam_scores[active], final_scores], axis=1)
        best = top_k(merged_scores, num_beams)[1]
        sequences[active, :, :width] = _gather(np.concatenate([sequences[active, :, :width], topk_sequences], 1), best)
        beam_scores[active] = _gather(merged_scores, best)
        origin[active, :, :steps] = _gather(np.concatenate([origin[active, :, :steps], topk_origin], axis=1), best)
        finished[active] = _gather(np.concatenate([finished[active], just_finished], axis=1), best)

        # g. the cache follows the surviving beams
        state.reorder(running_origin[active, :, cur_len - prompt_len].reshape(-1))
        cur_len += 1

        best_length = max_length - prompt_len if (early == "never" and penalty > 0.0) else cur_len - prompt_len
        best_running = running_scores[active, :1] / np.float32(best_length**penalty)
        worst_finished = np.where(finished[active], beam_scores[active].min(axis=1, keepdims=True), LARGE_NEGATIVE)
        may_improve[active] &= np.any(best_running > worst_finished, axis=-1, keepdims=True)
        # A sentence is settled once nothing can enter its finished set: it cannot improve, or (early stopping)
        # the set is full. Searching on would only add LARGE_NEGATIVE candidates that never rank.
        settled = ~may_improve[active, 0] | (finished[active].all(axis=1) & (early is True))
        if settled.all() or hits.all():
            break
        if prune is not None and settled.any():
            kept = np.flatnonzero(~settled)
            prune((kept[:, None] * num_beams + np.arange(num_beams)).reshape(-1))
            active = active[kept]

    generated = int(((origin[:, 0, :] + 1) != 0).sum(axis=1).max())
    return sequences[:, 0, : prompt_len + generated]
