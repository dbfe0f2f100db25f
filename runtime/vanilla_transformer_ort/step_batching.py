"""Step-level (continuous) batching: sentences join a running decoder batch at its next step and leave it at the
step they finish (iteration-level scheduling, Orca, OSDI '22), on the in-place decoder graph with per-row lengths
(export format 3).

`StepBatcher` keeps one decoder batch in preallocated buffers: per source slot the cross-attention keys and values
and the source mask, per row (a slot's beams) the self-attention cache and its own length; and one search over the
whole batch (`search.GreedySearch` or `search.BeamSearch`), whose sentences each have their own length. Before a
step, waiting sources are encoded in one encoder run into free slots and join the search; the step runs the graph
once over all rows, each row at its own length, and ranks every sentence's candidates at once. No cache is copied
when a sentence joins. A sentence that finishes leaves the batch at once and its submission is answered when its
last sentence is; before the next step the batch's last slot moves into its place (one slot's cache and cross K/V
copied), nothing else moves.

Each row's logits are those it gets alone (the graph computes every row from that row alone, and a source padded to
the batch's longest is masked), and the searches treat every sentence alone, so a submission's output equals
`OrtTranslator.generate` on its sentences (tested).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

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
from .search import BeamSearch, GreedySearch, sentence_rows, stack_outputs
from .sessions import import_onnxruntime
from .step_rows import BatchRows
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
    """One submission: its sentences' outputs as they finish, and its future."""

    future: Future
    outputs: list = field(default_factory=list)
    remaining: int = 0

    def answer(self, index: int, output: np.ndarray, fill: int) -> None:
        self.outputs[index] = output
        self.remaining -= 1
        if self.remaining == 0 and not self.future.done():
            self.future.set_result(stack_outputs(self.outputs, fill))

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


class StepBatcher:
    """One decoder batch that sentences join and leave at every step, for an `OrtTranslator` whose folder has the
    in-place decoder with per-row lengths (export format 3, CPU provider).

    Args:
        translator: the sessions (its encoder, in-place decoder and `beam_scores.onnx` ranker).
        max_sentences: sources decoded at once (rows: `max_sentences x num_beams`); later sources wait, the
            submissions taking turns.
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
        self.search = (
            GreedySearch(self.settings) if self.num_beams == 1 else BeamSearch(self.settings, self.vocab_size)
        )
        self.view = BatchRows(self)
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
        self.slots = np.zeros(0, np.int64)  # the slot of each sentence of the search, in its order
        self.members: list[tuple[_Job, int]] = []  # the submission of each sentence of the search, and its place
        self.used = 0  # slots [0, used) are in the batch; those in `freed` are holes until the next step
        self.freed: list[int] = []
        self.pending: deque[tuple[_Job, deque, bool]] = deque()  # submissions waiting for a slot, and `first`
        self.stats = StepStats()
        self._condition = threading.Condition()  # guards `pending`, `stats` and closing; the rest is the thread's
        self._closing = False
        self._failure: BaseException | None = None  # what stopped the batch's thread, if anything did
        self._thread = threading.Thread(target=self._loop, name="vt-step-batcher", daemon=True)
        self._thread.start()

    # -- the public side ------------------------------------------------------------------------------------------

    def submit(self, sources: Sequence[Sequence[int]], first: bool = False) -> Future:
        """Queue sources (token ids, EOS included); a future of their output ids. Sources join the batch as places
        free up, the waiting submissions taking turns in the order submitted; `first`: before those waiting (more
        work of a request that waited already, such as the server's placeholder retries)."""
        if not sources or any(len(ids) == 0 for ids in sources):
            raise ValueError("submit needs at least one source, each with at least one token")
        job = _Job(Future(), [None] * len(sources), len(sources))
        with self._condition:
            if self._closing:
                raise RuntimeError(
                    "the step batcher is closed"
                    if self._failure is None
                    else f"the step batcher stopped: {self._failure!r}"
                )
            waiting = (job, deque((index, list(ids)) for index, ids in enumerate(sources)), first)
            if first:
                self.pending.appendleft(waiting)
            else:
                self.pending.append(waiting)
            self._condition.notify_all()
        return job.future

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
            failure = RuntimeError(f"the step batcher stopped: {error!r}")
            for job, _ in self.members:
                job.fail(failure)
            for job, _, _ in pending:
                job.fail(failure)

    def _schedule(self) -> None:
        while True:
            with self._condition:
                while not self.pending and not self.search.size:
                    if self._closing:
                        return
                    self._condition.wait()
                joining = self._next_sentences(self.max_sentences - self.search.size)
            joining = [sentence for sentence in joining if not sentence[0].future.done()]  # not of a failed job
            if joining:
                self._join(joining)
            if self.search.size:
                self._step()

    def _next_sentences(self, free: int) -> list[tuple[_Job, int, list[int]]]:
        """Up to `free` waiting sentences, the submissions taking turns: the first waiting gives one sentence and
        goes to the back of the line, so that a short request that comes after a long one does not wait for all of
        it. A submission queued `first` keeps its place at the front until all its sentences joined."""
        taken = []
        while free > 0 and self.pending:
            job, sentences, first = self.pending.popleft()
            taken.append((job, *sentences.popleft()))
            free -= 1
            if sentences and first:
                self.pending.appendleft((job, sentences, first))
            elif sentences:
                self.pending.append((job, sentences, first))
        return taken

    def _join(self, sentences: list[tuple[_Job, int, list[int]]]) -> None:
        """Encode the sources in one encoder run into free slots; they join the search at its next step."""
        sources = [ids for _, _, ids in sentences]
        longest = max(len(ids) for ids in sources)
        input_ids = np.full((len(sources), longest), self.translator.settings.pad_token_id or 0, np.int64)
        attention_mask = np.zeros((len(sources), longest), np.int64)
        for row, ids in enumerate(sources):
            input_ids[row, : len(ids)], attention_mask[row, : len(ids)] = ids, 1
        try:
            names = [o.name for o in self.translator.encoder.get_outputs()]
            outputs = self.translator.encoder.run(None, {INPUT_IDS: input_ids, ATTENTION_MASK: attention_mask})
        except Exception as error:  # a failing encoder run fails its submissions, never the batch
            for job, _, _ in sentences:
                job.fail(error)
            return
        cross = {past_name(n): v for n, v in zip(names, outputs, strict=True) if n != LAST_HIDDEN_STATE}
        if longest > self.mask.shape[1]:
            self._resize_sources(max(longest, 2 * self.mask.shape[1]))
        slots = self._take_slots(len(sources))
        if self.used > self.mask.shape[0]:
            self._resize_slots(self.used)
        for name, value in cross.items():
            self.cross[name][slots, :, : value.shape[2]] = value
        self.mask[slots] = 0
        self.mask[slots, :longest] = attention_mask
        self.source_lengths[slots] = attention_mask.sum(axis=1)
        self.lengths[sentence_rows(slots, self.num_beams)] = 0
        self.slots = np.concatenate([self.slots, slots])
        self.members += [(job, index) for job, index, _ in sentences]
        self.search.add(len(sources))

    def _step(self) -> None:
        """One step of the search over the whole batch; the sentences it finishes leave, their submissions are
        answered when complete."""
        self._compact()
        self.search.step(self.view)
        done = self.search.done()
        if not done.any():
            return
        finished = np.flatnonzero(done).tolist()
        outputs = self.search.remove(done)
        for position, output in zip(finished, outputs, strict=True):
            job, index = self.members[position]
            job.answer(index, output, self.search.fill)
        self.freed += self.slots[done].tolist()
        self.slots = self.slots[~done]
        self.members = [member for member, gone in zip(self.members, done.tolist(), strict=True) if not gone]

    def _decode_step(self, rows: np.ndarray, last_tokens: np.ndarray) -> None:
        """Called by the search (through `BatchRows`): one decoder run over every row of the batch, each at its own
        length; `rows` are the buffers' rows of the search's `last_tokens`."""
        self.tokens[rows] = last_tokens
        count = self.used * self.num_beams
        self.lengths[:count] += 1
        total = int(self.lengths[:count].max())
        if total > next(iter(self.own.values())).shape[2]:
            self._resize_cache(total)
        started = time.perf_counter()
        self._decode(count, total)
        seconds = time.perf_counter() - started
        with self._condition:
            self.stats.steps += 1
            self.stats.rows += count
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

    # -- slots (the batch's thread only) ---------------------------------------------------------------------------

    def _take_slots(self, count: int) -> np.ndarray:
        """`count` free slots: holes first, then the end of the batch."""
        self.freed.sort()
        taken, self.freed = self.freed[:count], self.freed[count:]
        taken += list(range(self.used, self.used + count - len(taken)))
        self.used = max(self.used, max(taken) + 1)
        return np.asarray(taken, dtype=np.int64)

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
        beams = self.num_beams
        rows_from, rows_to = slice(source * beams, (source + 1) * beams), slice(target * beams, (target + 1) * beams)
        length = int(self.lengths[rows_from].max())
        for buffer in self.own.values():
            buffer[rows_to, :, :length] = buffer[rows_from, :, :length]
        for buffer in self.cross.values():
            buffer[target] = buffer[source]
        self.mask[target], self.source_lengths[target] = self.mask[source], self.source_lengths[source]
        self.lengths[rows_to] = self.lengths[rows_from]
        self.slots[self.slots == source] = target

    def _resize_slots(self, needed: int) -> None:
        """Buffers for at least `needed` sources (doubling, up to max_sentences), the batch's copied."""
        slots = min(self.max_sentences, max(needed, 2 * self.mask.shape[0]))
        rows = slots * self.num_beams

        def grown(array: np.ndarray, length: int) -> np.ndarray:
            new = np.zeros((length, *array.shape[1:]), array.dtype)
            new[: array.shape[0]] = array
            return new

        self.cross = {name: grown(value, slots) for name, value in self.cross.items()}
        self.mask, self.source_lengths = grown(self.mask, slots), grown(self.source_lengths, slots)
        self.lengths, self.tokens = grown(self.lengths, rows), grown(self.tokens, rows)
        self.own = {name: grown(value, rows) for name, value in self.own.items()}
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
