"""A cohort of step-level batching (`step_batching.StepBatcher`): the sentences of one submission, searched
together, as a `search.DecoderState` view of their rows in the shared batch; and the joining of a submission's
outputs when it was split into several cohorts."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING

import numpy as np

from .decoder_state import CacheState

if TYPE_CHECKING:
    from .step_batching import StepBatcher


class CohortState(CacheState):
    """The rows of one cohort in its `StepBatcher`, as `search.DecoderState`: `step` waits for the batch's next
    decoder run and returns this cohort's logits; `reorder` and `keep_rows` touch only this cohort's rows."""

    def __init__(self, batcher: StepBatcher, slots: np.ndarray):
        super().__init__(batcher.session, batcher.vocab_size, batcher.scorer)
        self.batcher, self.slots = batcher, slots  # (sentences,) the slot of each of its sentences, in search order
        self.tokens: np.ndarray | None = None  # (rows, 1) the tokens of its next step, once asked for
        self.length = 0  # decoded positions of each of its rows (they advance together)
        self.stepped = threading.Event()  # set when the batch has run the step it asked for

    def rows(self) -> np.ndarray:
        """(sentences x beams,) the batch rows of this cohort, in its search order."""
        beams = self.batcher.num_beams
        return (self.slots[:, None] * beams + np.arange(beams)).reshape(-1)  # (sentences, beams) -> (rows,)

    def _run(self, last_tokens: np.ndarray) -> np.ndarray:
        return self.batcher._step(self, last_tokens)

    def step(self, last_tokens: np.ndarray) -> np.ndarray:
        return self._run(last_tokens)[:, -1, :]

    def reorder(self, rows: np.ndarray) -> None:
        """Keep this cohort's rows `rows` (beam reordering): only its rows whose beam changed are copied."""
        changed = np.flatnonzero(rows != np.arange(rows.shape[0]))
        if changed.size == 0:
            return
        physical = self.rows()
        targets, sources = physical[changed], physical[rows[changed]]
        for buffer in self.batcher.own.values():
            buffer[targets, :, : self.length] = buffer[sources, :, : self.length]  # the right side is gathered first

    def keep_rows(self, rows: np.ndarray) -> None:
        """Only `rows` (whole sentences) stay: the others' slots leave the batch before its next step."""
        kept = rows[:: self.batcher.num_beams] // self.batcher.num_beams
        self.batcher._release(self, np.setdiff1d(np.arange(self.slots.shape[0]), kept))
        self.slots = self.slots[kept]


def join_outputs(parts: list[Future], whole: Future, fill: int) -> None:
    """Resolve `whole` with the outputs of `parts` stacked (padded with `fill` to the widest), or their first error."""
    remaining = [len(parts)]
    lock = threading.Lock()

    def done(_: Future) -> None:
        with lock:
            remaining[0] -= 1
            if remaining[0]:
                return
        errors = [part.exception() for part in parts if part.exception() is not None]
        if errors:
            whole.set_exception(errors[0])
            return
        outputs = [part.result() for part in parts]
        width = max(output.shape[1] for output in outputs)
        stacked = np.full((sum(o.shape[0] for o in outputs), width), fill, dtype=np.int64)
        start = 0
        for output in outputs:
            stacked[start : start + output.shape[0], : output.shape[1]] = output
            start += output.shape[0]
        whole.set_result(stacked)

    for part in parts:
        part.add_done_callback(done)
