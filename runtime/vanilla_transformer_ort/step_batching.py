"""Step-level (continuous) batching: sentences join a running decoder batch at its next step and leave it at the
step they finish (iteration-level scheduling, Orca, OSDI '22), on the in-place decoder graph with per-row lengths
(export format 3).

`StepBatcher` keeps one decoder batch in preallocated buffers: per source slot the cross-attention keys and values
and the source mask, per row (a slot's beams) the self-attention cache and its own length. A submission becomes a
cohort: its sources are encoded once, into free slots, and the runtime's own search (`search.greedy_search` or
`search.beam_search`, unchanged) runs for it in a thread of its own against a `CohortState`, a view of its rows.
A decoder step waits until every running cohort has asked for its next logits, then runs the graph once over all
rows, each row at its own length; no cache is copied when a cohort joins. A sentence that finishes leaves the batch
before the next step: the batch's last slot moves into its place (one slot's cache and cross K/V copied), nothing
else moves.

Each row's logits are those it gets alone (the graph computes every row from that row alone, and a source padded to
the batch's longest is masked), so a cohort's output equals `OrtTranslator.generate` on its sentences (tested).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from .contract import (
    ATTENTION_MASK,
    ENCODER_ATTENTION_MASK,
    INPUT_IDS,
    LAST_HIDDEN_STATE,
    LOGITS,
    SEQUENCE_LENGTHS,
    TOTAL_SEQUENCE_LENGTH,
    past_name,
    present_name,
)
from .search import beam_search, greedy_search
from .sessions import import_onnxruntime
from .step_cohorts import CohortState, join_outputs
from .translator import target_vocab_size

logger = logging.getLogger(__name__)

INITIAL_SOURCE_CAPACITY = 32  # source positions of the cross-attention buffers at first; they double when needed
INITIAL_CACHE_CAPACITY = 32  # decoded positions of the self-attention buffers at first; they double when needed
INITIAL_SLOTS = 8  # sources the buffers hold at first; they double as the batch grows, up to max_sentences


@dataclass
class StepStats:
    """What the batcher did since it was last asked: decoder steps, rows summed over them, and their seconds."""

    steps: int = 0
    rows: int = 0
    seconds: float = 0.0


@dataclass
class _Job:
    sources: list[list[int]]
    future: Future


class StepBatcher:
    """One decoder batch that sentences join and leave at every step, for an `OrtTranslator` whose folder has the
    in-place decoder with per-row lengths (export format 3, CPU provider).

    Args:
        translator: the sessions (its encoder, in-place decoder and `beam_scores.onnx` ranker).
        max_sentences: sources decoded at once (rows: `max_sentences x num_beams`); later submissions wait, in order.
        overrides: generation settings for every sentence (`num_beams`, `max_new_tokens`, ...), as in `generate`.

    `submit(sources)` returns a `concurrent.futures.Future` of the (sentences, 1 + generated) output of
    `translator.generate` on those sources; it may be called from any thread. `close()` finishes what was
    submitted, then stops.
    """

    def __init__(self, translator, max_sentences: int = 64, **overrides):
        if max_sentences < 1:
            raise ValueError(f"max_sentences must be >= 1, got {max_sentences}")
        if not translator.inplace or SEQUENCE_LENGTHS not in {i.name for i in translator.decoder.get_inputs()}:
            raise ValueError(
                f"Step-level batching needs the in-place decoder with per-row lengths (export format 3, CPU); "
                f"{translator.folder} does not have it: export it again with vt-export-onnx"
            )
        self.translator, self.session, self.scorer = translator, translator.decoder, translator.beam_scores
        self.settings = translator._settings(overrides)
        self.num_beams, self.max_sentences = self.settings.num_beams, max_sentences
        self.vocab_size = target_vocab_size(translator.config)
        self.ort = import_onnxruntime()
        heads, d_head = translator.num_heads, translator.d_head
        decoder_inputs = [i.name for i in self.session.get_inputs()]
        own = [name for name in decoder_inputs if ".decoder." in name]  # past_key_values.{i}.decoder.*
        self.cross_names = [name for name in decoder_inputs if ".encoder." in name]
        # Buffers for `slots` sources at first; they double with the batch, up to max_sentences.
        slots = min(max_sentences, INITIAL_SLOTS)
        rows = slots * self.num_beams
        self.own = {name: np.zeros((rows, heads, INITIAL_CACHE_CAPACITY, d_head), np.float32) for name in own}
        self.cross = {name: np.zeros((slots, heads, INITIAL_SOURCE_CAPACITY, d_head), np.float32)
                      for name in self.cross_names}  # fmt: skip
        self.mask = np.zeros((slots, INITIAL_SOURCE_CAPACITY), np.int64)
        self.source_lengths = np.zeros(slots, np.int64)
        self.lengths = np.zeros(rows, np.int32)  # decoded positions of each row
        self.tokens = np.zeros((rows, 1), np.int64)
        self.logits = np.empty((rows, 1, self.vocab_size), np.float32)
        self.owner: list[CohortState | None] = [None] * slots
        self.used = 0  # slots [0, used) are in the batch; those in `freed` are holes until the next step
        self.freed: list[int] = []
        self.cohorts: list[CohortState] = []
        self.pending: deque[_Job] = deque()
        self.stats = StepStats()
        self._condition = threading.Condition()
        self._closing = False
        self._failure: BaseException | None = None  # what stopped the batch's thread, if anything did
        self._thread = threading.Thread(target=self._loop, name="vt-step-batcher", daemon=True)
        self._thread.start()

    # -- the public side ------------------------------------------------------------------------------------------

    def submit(self, sources: Sequence[Sequence[int]]) -> Future:
        """Queue sources (token ids, EOS included) as one cohort; a future of their output ids. More than
        `max_sentences` sources are split into cohorts that join one after the other."""
        if not sources or any(len(ids) == 0 for ids in sources):
            raise ValueError("submit needs at least one source, each with at least one token")
        future: Future = Future()
        parts = [list(sources[i : i + self.max_sentences]) for i in range(0, len(sources), self.max_sentences)]
        part_futures = [Future() for _ in parts]
        if len(parts) == 1:
            part_futures = [future]
        else:
            join_outputs(part_futures, future, self._fill_value())
        with self._condition:
            if self._closing:
                raise RuntimeError(
                    "the step batcher is closed"
                    if self._failure is None
                    else f"the step batcher stopped: {self._failure!r}"
                )
            self.pending.extend(
                _Job([list(ids) for ids in part], f) for part, f in zip(parts, part_futures, strict=True)
            )
            self._condition.notify_all()
        return future

    def take_stats(self) -> StepStats:
        """The steps since the last call (and start counting anew)."""
        with self._condition:
            stats, self.stats = self.stats, StepStats()
        return stats

    def close(self) -> None:
        """Finish everything submitted, then stop the batch's thread."""
        with self._condition:
            self._closing = True
            self._condition.notify_all()
        self._thread.join()

    # -- the batch's thread ---------------------------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            self._schedule()
        except BaseException as error:  # a fault of the batch itself: fail everything, never hang
            logger.exception("The step batcher stopped")
            with self._condition:
                self._failure, self._closing = error, True
                pending, self.pending = list(self.pending), deque()
                for cohort in self.cohorts:
                    cohort.stepped.set()
            for job in pending:
                job.future.set_exception(RuntimeError(f"the step batcher stopped: {error!r}"))

    def _schedule(self) -> None:
        while True:
            with self._condition:
                while True:
                    if self._closing and not self.cohorts and not self.pending:
                        return
                    free = self.max_sentences - (self.used - len(self.freed))
                    joining = []
                    while self.pending and len(self.pending[0].sources) <= free:
                        free -= len(self.pending[0].sources)
                        joining.append(self.pending.popleft())
                    if joining:
                        break
                    if self.cohorts and all(cohort.tokens is not None for cohort in self.cohorts):
                        break
                    self._condition.wait()
            if joining:
                self._join(joining)  # their searches ask for their first step; the loop then waits for them
            else:
                self._run_step()

    def _join(self, jobs: list[_Job]) -> None:
        """Encode the jobs' sources in one encoder run into free slots, and start a search for each job."""
        sources = [ids for job in jobs for ids in job.sources]
        longest = max(len(ids) for ids in sources)
        input_ids = np.full((len(sources), longest), self.translator.settings.pad_token_id or 0, np.int64)
        attention_mask = np.zeros((len(sources), longest), np.int64)
        for row, ids in enumerate(sources):
            input_ids[row, : len(ids)], attention_mask[row, : len(ids)] = ids, 1
        try:
            names = [o.name for o in self.translator.encoder.get_outputs()]
            outputs = self.translator.encoder.run(None, {INPUT_IDS: input_ids, ATTENTION_MASK: attention_mask})
        except Exception as error:  # a failing encoder run fails its jobs, never the batch
            for job in jobs:
                job.future.set_exception(error)
            return
        cross = {past_name(n): v for n, v in zip(names, outputs, strict=True) if n != LAST_HIDDEN_STATE}
        with self._condition:
            if longest > self.mask.shape[1]:
                self._resize_sources(max(longest, 2 * self.mask.shape[1]))
            start = 0
            for job in jobs:
                count = len(job.sources)
                slots = self._take_slots(count)
                if self.used > self.mask.shape[0]:
                    self._resize_slots(self.used)
                for name, value in cross.items():
                    self.cross[name][slots, :, : value.shape[2]] = value[start : start + count]
                self.mask[slots] = 0
                self.mask[slots, :longest] = attention_mask[start : start + count]
                self.source_lengths[slots] = attention_mask[start : start + count].sum(axis=1)
                cohort = CohortState(self, slots)
                self.lengths[cohort.rows()] = 0
                for slot in slots.tolist():
                    self.owner[slot] = cohort
                self.cohorts.append(cohort)
                threading.Thread(target=self._search, args=(cohort, job), name="vt-cohort", daemon=True).start()
                start += count

    def _search(self, cohort: CohortState, job: _Job) -> None:
        count = cohort.slots.shape[0]
        try:
            search = greedy_search if self.num_beams == 1 else beam_search
            output, error = search(cohort, count, self.settings), None
        except BaseException as caught:  # the job fails, the batch goes on
            output, error = None, caught
            logger.exception("A cohort of %d sentences failed", count)
        with self._condition:
            self._release(cohort, np.arange(cohort.slots.shape[0]))
            cohort.slots = cohort.slots[:0]
            self.cohorts.remove(cohort)
            self._condition.notify_all()
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(output)

    def _step(self, cohort: CohortState, last_tokens: np.ndarray) -> np.ndarray:
        """Called by a cohort's search: wait for the batch's next decoder run, then its rows' logits (a copy)."""
        with self._condition:
            cohort.stepped.clear()
            cohort.tokens = np.asarray(last_tokens, dtype=np.int64).reshape(-1, 1)
            self._condition.notify_all()  # only the batch's thread waits on it: the cohorts wait on their own event
        cohort.stepped.wait()
        with self._condition:
            if self._failure is not None:
                raise RuntimeError(f"the step batcher stopped: {self._failure!r}")
            rows = cohort.rows()
        return self.logits[rows]  # stays valid until this cohort asks for its next step

    def _run_step(self) -> None:
        """One decoder run over every row of the batch (all cohorts have asked for it), each at its own length."""
        with self._condition:
            if self.logits.shape[0] < self.tokens.shape[0]:  # the slots grew at a join: the buffers cohorts use too
                self._resize_rows()  # first: compacting may move a slot that joined beyond the old rows
            self._compact()
            for cohort in self.cohorts:
                self.tokens[cohort.rows()] = cohort.tokens
            rows = self.used * self.num_beams
            self.lengths[:rows] += 1
            total = int(self.lengths[:rows].max())
            if total > next(iter(self.own.values())).shape[2]:
                self._resize_cache(total)
        started = time.perf_counter()
        self._decode(rows, total)
        seconds = time.perf_counter() - started
        with self._condition:
            for cohort in self.cohorts:
                cohort.tokens = None
                cohort.length += 1
                cohort.stepped.set()
            self.stats.steps += 1
            self.stats.rows += rows
            self.stats.seconds += seconds

    def _decode(self, rows: int, total: int) -> None:
        ort = self.ort
        binding = self.session.io_binding()
        binding.bind_cpu_input(INPUT_IDS, self.tokens[:rows])
        binding.bind_ortvalue_input(ENCODER_ATTENTION_MASK, ort.OrtValue.ortvalue_from_numpy(self.mask[: self.used]))
        binding.bind_cpu_input(TOTAL_SEQUENCE_LENGTH, np.array(total, dtype=np.int32))
        binding.bind_cpu_input(SEQUENCE_LENGTHS, self.lengths[:rows])
        for name, value in self.cross.items():
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value[: self.used]))
        for name, buffer in self.own.items():
            value = ort.OrtValue.ortvalue_from_numpy(buffer[:rows])
            binding.bind_ortvalue_input(name, value)
            binding.bind_ortvalue_output(present_name(name), value)  # the same buffer: written in place
        binding.bind_ortvalue_output(LOGITS, ort.OrtValue.ortvalue_from_numpy(self.logits[:rows]))
        self.session.run_with_iobinding(binding)

    # -- slots (called with the condition held) -------------------------------------------------------------------

    def _take_slots(self, count: int) -> np.ndarray:
        """`count` free slots: holes first, then the end of the batch."""
        self.freed.sort()
        taken, self.freed = self.freed[:count], self.freed[count:]
        taken += list(range(self.used, self.used + count - len(taken)))
        self.used = max(self.used, max(taken) + 1)
        return np.asarray(taken, dtype=np.int64)

    def _release(self, cohort: CohortState, positions: np.ndarray) -> None:
        """The slots of `cohort`'s sentences at `positions` leave the batch (holes until the next step)."""
        with self._condition:
            for slot in cohort.slots[positions].tolist():
                self.owner[slot] = None
                self.freed.append(slot)

    def _compact(self) -> None:
        """Fill the holes by moving the batch's last slots into them, so that the batch is slots [0, used)."""
        holes = set(self.freed)
        self.freed = []
        while holes:
            last = self.used - 1
            self.used -= 1
            if last in holes:
                holes.discard(last)
                continue
            hole = min(holes)
            holes.discard(hole)
            self._move(last, hole)
        if self.used == 0:  # an empty batch starts again from the initial capacities
            if next(iter(self.own.values())).shape[2] > INITIAL_CACHE_CAPACITY:
                self.own = {name: np.zeros((*b.shape[:2], INITIAL_CACHE_CAPACITY, b.shape[3]), np.float32)
                            for name, b in self.own.items()}  # fmt: skip
            return
        longest = int(self.source_lengths[: self.used].max())
        if 4 * longest <= self.mask.shape[1] and self.mask.shape[1] > INITIAL_SOURCE_CAPACITY:
            self._resize_sources(max(INITIAL_SOURCE_CAPACITY, 2 * longest))

    def _move(self, source: int, target: int) -> None:
        """Slot `source` (the batch's last) takes the place of slot `target` (a hole)."""
        cohort = self.owner[source]
        beams = self.num_beams
        rows_from, rows_to = slice(source * beams, (source + 1) * beams), slice(target * beams, (target + 1) * beams)
        for buffer in self.own.values():
            buffer[rows_to, :, : cohort.length] = buffer[rows_from, :, : cohort.length]
        for buffer in self.cross.values():
            buffer[target] = buffer[source]
        self.mask[target], self.source_lengths[target] = self.mask[source], self.source_lengths[source]
        self.lengths[rows_to] = self.lengths[rows_from]
        self.owner[target], self.owner[source] = cohort, None
        cohort.slots[cohort.slots == source] = target

    def _resize_slots(self, needed: int) -> None:
        """Slot-indexed buffers for at least `needed` sources (doubling, up to max_sentences), the batch's copied:
        those only this thread touches. The self-attention cache and the logits, which the cohorts' searches read and
        reorder, follow in `_resize_rows` once every search waits for the next step."""
        old = self.mask.shape[0]
        slots = min(self.max_sentences, max(needed, 2 * old))
        rows = slots * self.num_beams

        def grown(array: np.ndarray, length: int) -> np.ndarray:
            new = np.zeros((length, *array.shape[1:]), array.dtype)
            new[: array.shape[0]] = array
            return new

        self.cross = {name: grown(value, slots) for name, value in self.cross.items()}
        self.mask, self.source_lengths = grown(self.mask, slots), grown(self.source_lengths, slots)
        self.lengths, self.tokens = grown(self.lengths, rows), grown(self.tokens, rows)
        self.owner += [None] * (slots - old)

    def _resize_rows(self) -> None:
        """The self-attention cache and the logits for as many rows as the slot-indexed buffers hold."""
        rows = self.tokens.shape[0]
        for name, old in self.own.items():
            new = np.zeros((rows, *old.shape[1:]), np.float32)
            new[: old.shape[0]] = old
            self.own[name] = new
        self.logits = np.empty((rows, 1, self.vocab_size), np.float32)

    def _resize_sources(self, capacity: int) -> None:
        """Cross-attention buffers for `capacity` source positions (the batch's slots copied)."""
        keep = min(capacity, self.mask.shape[1])
        for name, old in self.cross.items():
            new = np.zeros((old.shape[0], old.shape[1], capacity, old.shape[3]), np.float32)
            new[: self.used, :, :keep] = old[: self.used, :, :keep]
            self.cross[name] = new
        mask = np.zeros((self.mask.shape[0], capacity), np.int64)
        mask[: self.used, :keep] = self.mask[: self.used, :keep]
        self.mask = mask

    def _resize_cache(self, needed: int) -> None:
        """Self-attention buffers for at least `needed` positions (doubling), the decoded positions copied."""
        old_capacity = next(iter(self.own.values())).shape[2]
        capacity = max(needed, min(2 * old_capacity, self.settings.max_new_tokens + 1))
        rows = self.used * self.num_beams
        for name, old in self.own.items():
            new = np.zeros((*old.shape[:2], capacity, old.shape[3]), np.float32)
            new[:rows, :, :old_capacity] = old[:rows]
            self.own[name] = new

    def _fill_value(self) -> int:
        settings = self.settings
        if self.num_beams == 1:
            pad = settings.pad_token_id
            return pad if pad is not None else (settings.eos_token_ids[0] if settings.eos_token_ids else 0)
        return settings.pad_token_id or (settings.eos_token_ids[0] if settings.eos_token_ids else -1)
