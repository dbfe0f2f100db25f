"""The decoder batch of step-level batching (`step_batching.StepBatcher`) as its search sees it: a
`search.DecoderState` whose sentence i is the source in slot `slots[i]` of the batch's buffers."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .contract import LOGITS
from .decoder_state import CacheState, scores_feed
from .search import sentence_rows

if TYPE_CHECKING:
    from .step_batching import StepBatcher


class BatchRows(CacheState):
    """Every row of a `StepBatcher`'s batch, in its search's order: `step` runs one decoder step over all of them,
    `step_top_k` ranks every sentence's candidates in one `beam_scores.onnx` run, `reorder` copies the cache rows
    whose beam changed. The batch is compact when its search steps: slots [0, used) are its sentences."""

    def __init__(self, batcher: StepBatcher):
        super().__init__(batcher.session, batcher.vocab_size, batcher.scorer)
        self.batcher = batcher

    def rows(self) -> np.ndarray:
        """(sentences x beams,) the buffers' row of each search row."""
        return sentence_rows(self.batcher.slots, self.batcher.num_beams)

    def step(self, last_tokens: np.ndarray) -> np.ndarray:
        rows = self.rows()
        self.batcher._decode_step(rows, last_tokens)
        return self.batcher.logits[rows, -1, :]  # (rows, vocab), a copy the search may overwrite

    def step_top_k(
        self, last_tokens: np.ndarray, running_scores: np.ndarray, bias: np.ndarray, batch_size: int, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """One decoder step and the k best candidates of each sentence, ranked over the buffers' rows as they lie
        (no copy of the logits), then put in the search's order."""
        batcher, rows = self.batcher, self.rows()
        batcher._decode_step(rows, last_tokens)
        count = batcher.used * batcher.num_beams
        column = np.zeros((count, 1), dtype=np.float32)
        column[rows] = running_scores
        feed = {LOGITS: batcher.logits[:count], **scores_feed(column, bias, batcher.used, k)}
        values, indices = self.scorer.run(None, feed)  # (used slots, k), in slot order
        return values[batcher.slots], indices[batcher.slots]

    def reorder(self, rows: np.ndarray) -> None:
        """Keep search rows `rows` (beam reordering): only the rows whose beam changed are copied."""
        changed = np.flatnonzero(rows != np.arange(rows.shape[0]))
        if changed.size == 0:
            return
        physical = self.rows()
        targets, sources = physical[changed], physical[rows[changed]]
        lengths = self.batcher.lengths[targets]
        # Rows of different sentences have different lengths: copied in groups of lengths within a factor of two
        # (each group up to its longest), not all up to the batch's longest.
        groups = np.log2(np.maximum(lengths, 1)).astype(np.int64)
        for group in np.unique(groups).tolist():
            members = groups == group
            length = int(lengths[members].max())
            group_targets, group_sources = targets[members], sources[members]
            for buffer in self.batcher.own.values():
                buffer[group_targets, :, :length] = buffer[group_sources, :, :length]  # the right side first
