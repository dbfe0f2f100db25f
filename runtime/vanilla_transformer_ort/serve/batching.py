"""Cross-request batching: the segments of concurrent requests share onnxruntime batches.

Every request's segments are tokenized on arrival and queued. Whenever a session is idle, the scheduler takes a
batch: at once if no other batch is running (waiting could only add latency), otherwise once the oldest queued
segment has waited `max_wait_ms` or the queue already fills a batch. A batch is the oldest segment first, then the
queued segments closest to it in length, until `max_batch_tokens` padded source tokens or `max_batch_size`
segments. The batch runs in a worker thread that owns one session (an `OrtTranslator`, or a `SessionProcess` that
decodes in a process of its own), so decoding never blocks the event loop, and each segment's future receives its
translation.

A segment's translation does not depend on its batch: every sentence's beams are searched separately, padding is
masked, and the exported graphs compute each row from that row alone (fp32; `tests/test_serve.py` checks it for
every answer under load). Dynamic int8 graphs quantize activations per tensor, with a scale taken over the whole
batch, so there a batch can move a row's scores by a rounding step: see docs/serving.md for what was measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

logger = logging.getLogger(__name__)

# Weight of the newest batch in the service rate's moving average: about the last ten batches count.
SERVICE_RATE_SMOOTHING = 0.2


class QueueFull(Exception):
    """The queue holds `max_queue` segments already: the caller should answer 429."""


class Overloaded(Exception):
    """The queued work would take longer than `max_queue_seconds` at the measured service rate: the caller should
    answer 503 at once, with `retry_after` (seconds) as the Retry-After header."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class ShuttingDown(Exception):
    """The scheduler no longer accepts work."""


class SessionLost(RuntimeError):
    """A session's process ended during a batch (killed, out of memory); it was replaced, the batch failed and its
    requests may be retried."""


@dataclass
class BatchStats:
    """What one batch did, for metrics: segments, padded source tokens, generated tokens, seconds."""

    size: int
    source_tokens: int
    generated_tokens: int
    seconds: float


@dataclass
class _Segment:
    ids: list[int]
    request: int
    future: asyncio.Future
    arrived: float
    order: int = field(default=0)


class Engine:
    """One model's sessions and tokenizer, as the scheduler uses them.

    `translators` are `OrtTranslator`s of the same folder (one per worker thread); `options` are generation
    overrides (`num_beams`, `max_new_tokens`, ...) applied to every batch; `max_source_tokens` cuts over-long
    segments (the encoder's positional table ends there).
    """

    def __init__(self, translators: Sequence, options: dict | None = None, max_source_tokens: int | None = None):
        if not translators:
            raise ValueError("an Engine needs at least one translator")
        self.translators = list(translators)
        self.options = {k: v for k, v in (options or {}).items() if v is not None}
        first = self.translators[0]
        self.tokenizer = first.tokenizer
        self.pad_id = first.settings.pad_token_id or 0
        self.eos_ids = list(first.settings.eos_token_ids)
        self.max_source_tokens = max_source_tokens or first.config.get("max_position_embeddings")

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, EOS kept, cut to `max_source_tokens` (the last kept token is then EOS)."""
        encoded = [list(e.ids) for e in self.tokenizer.encode_batch(texts)]
        limit = self.max_source_tokens
        if limit:
            for row, ids in enumerate(encoded):
                if len(ids) > limit:
                    logger.warning("A segment of %d tokens was cut to %d", len(ids), limit)
                    keep = ids[: limit - 1] + (
                        [ids[-1]] if ids and ids[-1] in self.eos_ids else ids[limit - 1 : limit]
                    )
                    encoded[row] = keep
        return encoded

    def run(self, worker: int, batch: list[list[int]]) -> tuple[list[str], int]:
        """Translate token-id rows on session `worker`: (texts, generated tokens). Runs in a worker thread."""
        longest = max(len(ids) for ids in batch)
        input_ids = np.full((len(batch), longest), self.pad_id, dtype=np.int64)  # (batch, longest)
        attention_mask = np.zeros((len(batch), longest), dtype=np.int64)
        for row, ids in enumerate(batch):
            input_ids[row, : len(ids)] = ids
            attention_mask[row, : len(ids)] = 1
        translator = self.translators[worker]
        output = translator.generate(input_ids, attention_mask, **self.options)  # (batch, 1 + generated)
        generated = int(np.isin(output[:, 1:], [self.pad_id], invert=True).sum())
        texts = self.tokenizer.decode_batch(output.tolist(), skip_special_tokens=True)
        return [text.strip() for text in texts], generated


class BatchScheduler:
    """Queue, batch and run the segments of one `Engine`, on its sessions, from an asyncio event loop.

    Args:
        engine: the model's sessions.
        max_batch_tokens: padded source tokens in one batch (rows x longest row).
        max_batch_size: segments in one batch.
        max_wait_ms: how long the oldest queued segment may wait for company before its batch starts, while
            another batch runs (with every session idle, a batch starts at once).
        max_queue: queued segments beyond which `submit` raises `QueueFull`.
        max_queue_seconds: admission control: `submit` raises `Overloaded` when the queued segments and the new
            request's would take longer than this to start at the measured service rate (`service_rate`), so that
            what is accepted is answered in bounded time and the excess is refused at once instead of queueing
            without bound. None: only `max_queue` bounds the queue.
        cross_request: False keeps each request's segments in batches of their own (batching off, for comparison).
        on_batch: called on the event loop with each batch's `BatchStats`.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        max_batch_tokens: int = 4096,
        max_batch_size: int = 64,
        max_wait_ms: float = 5.0,
        max_queue: int = 2048,
        max_queue_seconds: float | None = None,
        cross_request: bool = True,
        on_batch: Callable[[BatchStats], None] | None = None,
    ):
        for name, value in (
            ("max_batch_tokens", max_batch_tokens),
            ("max_batch_size", max_batch_size),
            ("max_queue", max_queue),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
        if max_queue_seconds is not None and max_queue_seconds <= 0:
            raise ValueError(f"max_queue_seconds must be > 0, got {max_queue_seconds}")
        self.engine = engine
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.max_wait = max_wait_ms / 1000
        self.max_queue = max_queue
        self.max_queue_seconds = max_queue_seconds
        self._segment_seconds: float | None = None  # smoothed session-seconds per segment of the recent batches
        self.cross_request = cross_request
        self.on_batch = on_batch
        self._queue: list[_Segment] = []
        self._arrival: asyncio.Event | None = None
        self._idle: asyncio.Queue[int] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._task: asyncio.Task | None = None
        self._running: set[asyncio.Task] = set()
        self._requests = itertools.count()
        self._order = itertools.count()
        self._closing = False

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def busy_sessions(self) -> int:
        return len(self._running)

    @property
    def service_rate(self) -> float | None:
        """Segments per second that all sessions together finish, from the recent batches (an exponential moving
        average of each batch's seconds per segment, times the sessions); None before the first batch."""
        if self._segment_seconds is None:
            return None
        return len(self.engine.translators) / self._segment_seconds

    def expected_wait(self, segments: int = 0) -> float | None:
        """Seconds until the queued segments, and `segments` more, have started, at `service_rate`."""
        rate = self.service_rate
        return None if rate is None else (len(self._queue) + segments) / rate

    def _measure(self, segments: int, seconds: float) -> None:
        per_segment = seconds / segments
        previous = self._segment_seconds
        self._segment_seconds = (
            per_segment if previous is None else previous + SERVICE_RATE_SMOOTHING * (per_segment - previous)
        )

    async def start(self) -> None:
        """Start the scheduler on the running event loop (one worker thread per session)."""
        workers = len(self.engine.translators)
        self._arrival = asyncio.Event()
        self._idle = asyncio.Queue()
        for worker in range(workers):
            self._idle.put_nowait(worker)
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vt-session")
        self._task = asyncio.create_task(self._schedule(), name="vt-batch-scheduler")

    def submit(self, texts: list[str], admitted: bool = False) -> list[asyncio.Future]:
        """Queue one request's segments; returns a future per segment (its translation). Raises `QueueFull`,
        `Overloaded` or `ShuttingDown`; nothing is queued then. A request that finds the queue empty is always
        admitted, however long it is (it is refused by its size limits, not by the rate). `admitted`: more work of
        a request admitted before (its placeholder retries), never refused while the scheduler runs."""
        if (self._closing and not admitted) or self._task is None:
            raise ShuttingDown("the server is shutting down")
        if not admitted and len(self._queue) + len(texts) > self.max_queue:
            raise QueueFull(f"the queue holds {len(self._queue)} of {self.max_queue} segments; retry shortly")
        wait = None if admitted else self.expected_wait(len(texts))
        if self.max_queue_seconds is not None and wait is not None and wait > self.max_queue_seconds and self._queue:
            raise Overloaded(
                f"the queued work takes {wait:.1f} s at the measured rate, over {self.max_queue_seconds:g} s",
                retry_after=max(1, math.ceil(wait - self.max_queue_seconds)),
            )
        loop = asyncio.get_running_loop()
        request = next(self._requests)
        now = time.monotonic()
        segments = [
            _Segment(ids, request, loop.create_future(), now, next(self._order))
            for ids in self.engine.encode(list(texts))
        ]
        self._queue.extend(segments)
        self._arrival.set()
        return [segment.future for segment in segments]

    async def close(self) -> None:
        """Refuse new work, finish everything queued and running, then stop the worker threads."""
        self._closing = True
        while self._queue or self._running:
            self._arrival.set()
            await asyncio.sleep(0.005)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    # -- scheduling -----------------------------------------------------------------------------------------------

    async def _schedule(self) -> None:
        while True:
            worker = await self._idle.get()
            batch = await self._next_batch()
            task = asyncio.create_task(self._execute(worker, batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _next_batch(self) -> list[_Segment]:
        """Wait for work, give it `max_wait` to gather company, and take a batch (never empty)."""
        while True:
            self._drop_cancelled()
            if not self._queue:
                self._arrival.clear()
                await self._arrival.wait()
                continue
            waited = time.monotonic() - self._queue[0].arrived
            # Company is worth waiting for only while another batch runs: with every session idle, the queue has
            # all there is, and waiting would only add to the latency.
            busy = bool(self._running)
            if busy and not self._closing and waited < self.max_wait and not self._batch_is_full():
                self._arrival.clear()
                with contextlib.suppress(asyncio.TimeoutError):  # the builtin one from Python 3.11 on
                    await asyncio.wait_for(self._arrival.wait(), self.max_wait - waited)
                continue
            batch = self._take_batch()
            if batch:
                return batch

    def _drop_cancelled(self) -> None:
        """Segments whose request went away (timed out, client gone) are not translated."""
        if any(segment.future.done() for segment in self._queue):
            self._queue = [segment for segment in self._queue if not segment.future.done()]

    def _candidates(self) -> list[_Segment]:
        if self.cross_request:
            return self._queue
        request = self._queue[0].request
        return [segment for segment in self._queue if segment.request == request]

    def _batch_is_full(self) -> bool:
        candidates = self._candidates()
        if len(candidates) >= self.max_batch_size:
            return True
        longest = max(len(segment.ids) for segment in candidates)
        return len(candidates) * longest >= self.max_batch_tokens

    def _take_batch(self) -> list[_Segment]:
        """The oldest segment, then the candidates nearest to it in length (older first among equals), within the
        token and size budgets."""
        candidates = self._candidates()
        anchor = candidates[0]
        others = sorted(candidates[1:], key=lambda s: (abs(len(s.ids) - len(anchor.ids)), s.order))
        batch, longest = [anchor], len(anchor.ids)
        for segment in others:
            if len(batch) >= self.max_batch_size:
                break
            width = max(longest, len(segment.ids))
            if (len(batch) + 1) * width > self.max_batch_tokens:
                continue
            batch.append(segment)
            longest = width
        taken = {id(segment) for segment in batch}
        self._queue = [segment for segment in self._queue if id(segment) not in taken]
        return batch

    async def _execute(self, worker: int, batch: list[_Segment]) -> None:
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            texts, generated = await loop.run_in_executor(
                self._executor, self.engine.run, worker, [segment.ids for segment in batch]
            )
        except Exception as error:  # a failing batch fails its requests, never the scheduler
            logger.exception("A batch of %d segments failed", len(batch))
            for segment in batch:
                if not segment.future.done():
                    segment.future.set_exception(error)
        else:
            seconds = time.perf_counter() - started
            self._measure(len(batch), seconds)
            for segment, text in zip(batch, texts, strict=True):
                if not segment.future.done():  # its request may have gone away meanwhile
                    segment.future.set_result(text)
            if self.on_batch is not None:
                longest = max(len(segment.ids) for segment in batch)
                self.on_batch(BatchStats(len(batch), len(batch) * longest, generated, seconds))
        finally:
            self._idle.put_nowait(worker)
