"""Greedy and beam search in numpy, with transformers' `generate()` semantics (v5.24), for any step function.

The decoder is abstracted as a `DecoderState`: `step(last_tokens)` returns next-token logits and advances the cache,
`reorder(rows)` keeps the given cache rows (beam reordering). Scores are kept in float32 like transformers does.

`GreedySearch` and `BeamSearch` hold the searches' bookkeeping for sentences that each have their own length, so
that sentences may join a running search between steps and leave it when they finish (step-level batching,
`step_batching.py`): every sentence is searched exactly as it would be alone. `greedy_search` and `beam_search`
run one batch of sentences that start together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .ranking import gather, log_softmax, top_k

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


def _output_fill_value(settings: GenerationSettings) -> int:
    # transformers fills beam outputs with `pad_token_id or eos_token_id[0]`: a pad id of 0 is falsy there,
    # so with pad 0 the unused tail of shorter hypotheses holds EOS. Reproduced for token-identical outputs.
    if not settings.eos_token_ids:
        return -1
    return settings.pad_token_id or settings.eos_token_ids[0]


def processed_scores(scores: np.ndarray, cur_lens: np.ndarray, settings: GenerationSettings) -> np.ndarray:
    """`process_scores` for rows at different lengths: `cur_lens` (rows,) counts each row's decoder start token."""
    lengths = np.unique(cur_lens)
    if lengths.size == 1:
        return process_scores(scores, int(lengths[0]), settings)
    for length in lengths.tolist():
        rows = cur_lens == length
        scores[rows] = process_scores(scores[rows], length, settings)
    return scores


def sentence_rows(sentences: np.ndarray, num_beams: int) -> np.ndarray:
    """The decoder rows of these sentences (int64 indices), each sentence's `num_beams` rows adjacent."""
    return (sentences[:, None] * num_beams + np.arange(num_beams)).reshape(-1)  # (sentences, beams) -> (rows,)


def stack_outputs(outputs: list[np.ndarray], fill: int) -> np.ndarray:
    """Sentences' output ids (each 1 + its own generated length) as one (sentences, 1 + longest) array, the shorter
    filled with `fill`, as `generate()` returns a batch."""
    stacked = np.full((len(outputs), max(output.shape[0] for output in outputs)), fill, dtype=np.int64)
    for row, output in enumerate(outputs):
        stacked[row, : output.shape[0]] = output
    return stacked


class GreedySearch:
    """Greedy decoding of sentences that each have their own length: `add` sentences between steps, `step` them all
    once, `remove` those that are `done`. Sentence i of the search is row i of its `DecoderState`."""

    def __init__(self, settings: GenerationSettings):
        self.settings, self.max_length = settings, settings.max_new_tokens + 1
        pad = settings.pad_token_id
        self.fill = pad if pad is not None else (settings.eos_token_ids[0] if settings.eos_token_ids else 0)
        self.tokens = np.empty((0, self.max_length), dtype=np.int64)  # start token, generated, then `fill`
        self.cur_lens = np.empty(0, dtype=np.int64)  # tokens so far, the start token included
        self.unfinished = np.empty(0, dtype=bool)

    @property
    def size(self) -> int:
        return self.cur_lens.shape[0]

    def add(self, count: int) -> None:
        tokens = np.full((count, self.max_length), self.fill, dtype=np.int64)
        tokens[:, 0] = self.settings.decoder_start_token_id
        self.tokens = np.concatenate([self.tokens, tokens])
        self.cur_lens = np.concatenate([self.cur_lens, np.ones(count, dtype=np.int64)])
        self.unfinished = np.concatenate([self.unfinished, np.ones(count, dtype=bool)])

    def rows(self, sentences: np.ndarray) -> np.ndarray:
        """The state's rows of these sentences."""
        return sentences

    def step(self, state: DecoderState) -> None:
        """One decoder step for every sentence, and its next token."""
        sentences = np.arange(self.size)
        last = self.tokens[sentences, self.cur_lens - 1][:, None]  # (sentences, 1)
        next_tokens = processed_scores(state.step(last), self.cur_lens, self.settings).argmax(axis=-1)
        if self.settings.eos_token_ids:
            next_tokens = np.where(self.unfinished, next_tokens, self.fill)  # a state without keep_rows steps them on
            self.unfinished &= ~np.isin(next_tokens, self.settings.eos_token_ids)
        self.tokens[sentences, self.cur_lens] = next_tokens
        self.cur_lens += 1

    def done(self) -> np.ndarray:
        """(sentences,) bool: which are finished (EOS, or the maximum length)."""
        return ~self.unfinished | (self.cur_lens >= self.max_length)

    def remove(self, sentences: np.ndarray) -> list[np.ndarray]:
        """Take these sentences (bool mask) out of the search; their output ids, start token first."""
        outputs = [self.tokens[i, : self.cur_lens[i]].copy() for i in np.flatnonzero(sentences).tolist()]
        kept = ~sentences
        self.tokens, self.cur_lens, self.unfinished = self.tokens[kept], self.cur_lens[kept], self.unfinished[kept]
        return outputs


class BeamSearch:
    """transformers' beam search (v5.24) for sentences that each have their own length: `add` sentences between
    steps, `step` them all once, `remove` those that are `done`. Sentence i of the search is rows
    [i * num_beams, (i + 1) * num_beams) of its `DecoderState`.

    A state that `ranks_candidates` ranks a step's candidates itself (`step_top_k`, the exported `beam_scores.onnx`)
    whenever the logit processors are one additive bias for every sentence; otherwise numpy ranks them.
    """

    _ARRAYS = ("running", "running_scores", "sequences", "beam_scores", "finished", "may_improve", "running_origin",
               "origin", "cur_lens")  # fmt: skip

    def __init__(self, settings: GenerationSettings, vocab_size: int):
        self.settings, self.vocab_size = settings, vocab_size
        self.num_beams, self.max_length = settings.num_beams, settings.max_new_tokens + 1
        self.eos = np.asarray(settings.eos_token_ids, dtype=np.int64)
        self.k = max(2, 1 + len(self.eos)) * self.num_beams  # candidates kept per step
        self.top_num_beam_mask = np.arange(self.k) < self.num_beams
        self.fill = _output_fill_value(settings)
        self._norms: dict[int, np.float32] = {}
        self._biases: dict[int, np.ndarray | None] = {}
        self.add(0)

    @property
    def size(self) -> int:
        return self.cur_lens.shape[0]

    def add(self, count: int) -> None:
        """`count` sentences join at their first step (after those searched already)."""
        beams, length = self.num_beams, self.max_length
        running = np.full((count, beams, length), self.fill, dtype=np.int64)
        running[:, :, 0] = self.settings.decoder_start_token_id
        running_scores = np.zeros((count, beams), dtype=np.float32)
        running_scores[:, 1:] = LARGE_NEGATIVE  # only the first beam expands at step one
        new = {
            "running": running,
            "running_scores": running_scores,
            "sequences": running.copy(),
            "beam_scores": np.full((count, beams), LARGE_NEGATIVE, dtype=np.float32),
            "finished": np.zeros((count, beams), dtype=bool),
            "may_improve": np.ones((count, 1), dtype=bool),
            "running_origin": np.full((count, beams, length - 1), -1, dtype=np.int64),
            "origin": np.full((count, beams, length - 1), -1, dtype=np.int64),
            "cur_lens": np.ones(count, dtype=np.int64),
        }
        for name in self._ARRAYS:
            current = getattr(self, name, None)
            setattr(self, name, new[name] if current is None else np.concatenate([current, new[name]]))

    def rows(self, sentences: np.ndarray) -> np.ndarray:
        """The state's rows of these sentences (int64 indices), each sentence's beams adjacent."""
        return sentence_rows(sentences, self.num_beams)

    def _norm(self, length: int) -> np.float32:
        # length ** length_penalty as transformers computes it (a Python float, then float32)
        if length not in self._norms:
            self._norms[length] = np.float32(length**self.settings.length_penalty)
        return self._norms[length]

    def _norms_of(self, lengths: np.ndarray) -> np.ndarray:
        return np.array([self._norm(length) for length in lengths.tolist()], dtype=np.float32)

    def bias(self) -> np.ndarray | None:
        """The logit processors of this step as one additive (vocab,) bias for every sentence, or None."""
        biases = []
        for length in np.unique(self.cur_lens).tolist():
            if length not in self._biases:
                self._biases[length] = score_bias(length, self.settings, self.vocab_size)
            biases.append(self._biases[length])
        if any(bias is None for bias in biases) or any(not np.array_equal(b, biases[0]) for b in biases[1:]):
            return None
        return biases[0]

    def step(self, state: DecoderState) -> None:
        """One decoder step for every sentence: rank the candidates, keep the best beams, reorder the state."""
        n, beams = self.size, self.num_beams
        sentences = np.arange(n)
        last = self.running[sentences, :, self.cur_lens - 1].reshape(-1, 1)  # (n, beams) -> (rows, 1)
        # a-b. log-probabilities, logit processors, plus the running scores; the top 2 x num_beams per sentence
        bias = self.bias() if state.ranks_candidates else None
        if bias is not None:
            vocab = state.vocab_size
            running = self.running_scores.reshape(-1, 1)  # (n, beams) -> (rows, 1)
            topk_scores, topk_indices = state.step_top_k(last, running, bias, n, self.k)
        else:
            log_probs = log_softmax(state.step(last))  # (rows, vocab)
            log_probs = processed_scores(log_probs, np.repeat(self.cur_lens, beams), self.settings)
            vocab = log_probs.shape[-1]
            log_probs += self.running_scores.reshape(-1, 1)  # (n, beams) -> (rows, 1)
            candidates = log_probs.reshape(n, beams * vocab)  # (rows, vocab) -> (n, beams x vocab)
            topk_scores, topk_indices = top_k(candidates, self.k)
        state.reorder(self._advance(topk_scores, topk_indices, vocab))

    def _advance(self, topk_scores: np.ndarray, topk_indices: np.ndarray, vocab: int) -> np.ndarray:
        """Steps c-g of transformers' beam search on a step's top candidates (n, k); the state's rows to keep."""
        n, beams = self.size, self.num_beams
        penalty, early = self.settings.length_penalty, self.settings.early_stopping
        sentences, cur_lens = np.arange(n), self.cur_lens
        # c. the top continuations over all beams of a sentence. Every hypothesis holds its fill value beyond
        # position cur_len (origins: beyond cur_len - 1), so only the columns up to the longest are gathered.
        source_beam, token = topk_indices // vocab, topk_indices % vocab
        width = int(cur_lens.max()) + 1
        steps = width - 1
        topk_sequences = gather(self.running[:, :, :width], source_beam)
        topk_sequences[sentences, :, cur_lens] = token
        topk_origin = gather(self.running_origin[:, :, :steps], source_beam)
        topk_origin[sentences, :, cur_lens - 1] = source_beam + (sentences * beams)[:, None]  # rows of the state

        # d. which continuations stop here (EOS, or maximum length)
        hits = (token[..., None] == self.eos).any(axis=-1) | (cur_lens + 1 >= self.max_length)[:, None]

        # e. the best unfinished continuations keep running
        open_scores = topk_scores + hits.astype(np.float32) * LARGE_NEGATIVE
        keep = top_k(open_scores, beams)[1]
        self.running[:, :, :width], self.running_scores = gather(topk_sequences, keep), gather(open_scores, keep)
        self.running_origin[:, :, :steps] = gather(topk_origin, keep)

        # f. finished candidates among the top num_beams compete with the finished set, length-penalised
        just_finished = hits & self.top_num_beam_mask[None, :]
        final_scores = topk_scores / self._norms_of(cur_lens)[:, None]  # generated length: cur_len + 1 - 1
        full = self.finished.all(axis=1, keepdims=True) & (early is True)
        final_scores = final_scores + full.astype(np.float32) * LARGE_NEGATIVE
        final_scores = final_scores + (~self.may_improve).astype(np.float32) * LARGE_NEGATIVE
        final_scores = final_scores + (~just_finished).astype(np.float32) * LARGE_NEGATIVE
        merged_scores = np.concatenate([self.beam_scores, final_scores], axis=1)
        best = top_k(merged_scores, beams)[1]
        self.sequences[:, :, :width] = gather(np.concatenate([self.sequences[:, :, :width], topk_sequences], 1), best)
        self.beam_scores = gather(merged_scores, best)
        self.origin[:, :, :steps] = gather(np.concatenate([self.origin[:, :, :steps], topk_origin], axis=1), best)
        self.finished = gather(np.concatenate([self.finished, just_finished], axis=1), best)

        # g. the cache follows the surviving beams
        rows = self.running_origin[sentences, :, cur_lens - 1].reshape(-1)  # (n, beams) -> (rows,)
        self.cur_lens = cur_lens = cur_lens + 1
        never = early == "never" and penalty > 0.0
        best_lengths = np.full(n, self.max_length - 1) if never else cur_lens - 1
        best_running = self.running_scores[:, :1] / self._norms_of(best_lengths)[:, None]
        worst_finished = np.where(self.finished, self.beam_scores.min(axis=1, keepdims=True), LARGE_NEGATIVE)
        self.may_improve &= np.any(best_running > worst_finished, axis=-1, keepdims=True)
        return rows

    def done(self) -> np.ndarray:
        """(sentences,) bool: whose result can no longer change. A sentence is settled once nothing can enter its
        finished set (it cannot improve, or with early stopping the set is full), or at the maximum length."""
        early = self.settings.early_stopping
        settled = ~self.may_improve[:, 0] | (self.finished.all(axis=1) & (early is True))
        return settled | (self.cur_lens >= self.max_length)

    def remove(self, sentences: np.ndarray) -> list[np.ndarray]:
        """Take these sentences (bool mask) out of the search; each one's best hypothesis, start token first."""
        outputs = []
        for i in np.flatnonzero(sentences).tolist():
            generated = int(((self.origin[i, 0] + 1) != 0).sum())
            outputs.append(self.sequences[i, 0, : 1 + generated].copy())
        kept = ~sentences
        for name in self._ARRAYS:
            setattr(self, name, getattr(self, name)[kept])
        return outputs


def run_search(search: GreedySearch | BeamSearch, state: DecoderState, batch_size: int) -> np.ndarray:
    """Search `batch_size` sentences that start together to the end: (batch, 1 + generated) int64, like
    `generate()`. A finished sentence leaves the decoder's batch where the state can `keep_rows`; a state without it
    keeps computing every row until all are done (their results do not change)."""
    search.add(batch_size)
    outputs: list[np.ndarray | None] = [None] * batch_size
    order = np.arange(batch_size)  # each searched sentence's place in the batch, in the state's order
    prune = getattr(state, "keep_rows", None)
    while search.size:
        search.step(state)
        done = search.done()
        if not done.any() or (prune is None and not done.all()):
            continue
        for place, output in zip(order[done].tolist(), search.remove(done), strict=True):
            outputs[place] = output
        order = order[~done]
        if search.size and prune is not None:
            prune(search.rows(np.flatnonzero(~done)))
    return stack_outputs(outputs, search.fill)


def greedy_search(state: DecoderState, batch_size: int, settings: GenerationSettings) -> np.ndarray:
    """Greedy decoding; returns (batch, 1 + generated) int64 with the start token first, finished rows pad-filled."""
    return run_search(GreedySearch(settings), state, batch_size)


def beam_search(state: DecoderState, batch_size: int, settings: GenerationSettings) -> np.ndarray:
    """Beam search returning the best hypothesis per row: (batch, 1 + longest) int64, like `generate()`.

    `state` must hold batch * num_beams rows (each source repeated num_beams times, adjacent). A state that
    `ranks_candidates` ranks them itself with `step_top_k` (the exported `beam_scores.onnx`); otherwise numpy does.
    """
    return run_search(BeamSearch(settings, state.vocab_size), state, batch_size)
