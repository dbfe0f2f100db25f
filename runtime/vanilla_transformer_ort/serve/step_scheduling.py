"""Step-level scheduling for the server (`--step_batching`): each request's segments go at once to a session's
`StepBatcher` (`step_batching.py`), where they join the running decoder batch at its next step and leave it when
they finish, instead of waiting for a batch to end or to fill.

`StepScheduler` offers the batch scheduler's interface to the service (`submit`, `close`, `queue_depth`,
`busy_sessions`, `expected_wait`, the same `QueueFull` / `Overloaded` / `ShuttingDown` refusals), so admission
control means what it means for request-level batches: a request whose segments would wait more than
`max_queue_seconds` for a place in a decoder batch, behind those waiting already, at the service rate measured from
the answers, is refused at once with a 503. A segment that finds a free place joins at the next step, whatever the
load; how long the decoding of a full batch takes is bounded by the batch's size (`max_sentences`), not here.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

from .batching import BatchStats, Engine, Overloaded, QueueFull, ShuttingDown
from .models import batch_dependent
from .settings import ServeSettings

# Answers over which the service rate is measured.
RATE_WINDOW = 64


def step_level(folder, settings: ServeSettings) -> bool:
    """Whether a pair is served with step-level batching: as `step_batching` says, or where it is None (the
    default), wherever it can be: requests batched together, the CPU provider, and an export folder of format 3
    whose int8 graphs, if any, quantize each row on its own."""
    if settings.step_batching is not None:
        return settings.step_batching
    return (
        settings.batching and settings.provider == "cpu" and folder.has_per_row_lengths and not batch_dependent(folder)
    )


class StepScheduler:
    """Admission and dispatch of one `Engine`'s requests to its step sessions (`StepSession` or
    `StepSessionProcess`, each holding a `StepBatcher` of `max_sentences` sources).

    Args:
        engine: the model's step sessions (`engine.translators`) and its tokenizer.
        max_sentences: sources each session decodes at once; beyond them, segments wait for a place.
        max_queue: waiting segments beyond which `submit` raises `QueueFull`.
        max_queue_seconds: `submit` raises `Overloaded` when the new request's segments would wait longer than this
            for a place in a decoder batch, at the measured service rate. None: only `max_queue` bounds them.
        on_batch: called on the event loop with each answered request's `BatchStats` (its segments, source tokens,
            generated tokens and seconds from submission to answer).
        on_steps: called on the event loop with the sessions' `StepStats` (decoder steps, rows summed over them)
            after each answer.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        max_sentences: int,
        max_queue: int = 2048,
        max_queue_seconds: float | None = None,
        on_batch: Callable[[BatchStats], None] | None = None,
        on_steps: Callable[[object], None] | None = None,
    ):
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        if max_queue_seconds is not None and max_queue_seconds <= 0:
            raise ValueError(f"max_queue_seconds must be > 0, got {max_queue_seconds}")
        self.engine, self.max_sentences = engine, max_sentences
        self.max_queue, self.max_queue_seconds = max_queue, max_queue_seconds
        self.on_batch, self.on_steps = on_batch, on_steps
        self._outstanding = [0] * len(engine.translators)  # segments submitted and not yet answered, per session
        # (segments, busy seconds since the previous answer) of the recent answers: the rate is what the sessions
        # answer while they have work, not the rate of the requests that came (which admission itself limits)
        self._answered: deque[tuple[int, float]] = deque(maxlen=RATE_WINDOW)
        self._busy_since: float | None = None  # since when something is outstanding (or the previous answer)
        self._closing, self._started = False, False
        self._requests = itertools.count()

    @property
    def capacity(self) -> int:
        """Sources decoded at once by all sessions together."""
        return self.max_sentences * len(self.engine.translators)

    @property
    def queue_depth(self) -> int:
        """Segments waiting for a place in a decoder batch."""
        return max(0, sum(self._outstanding) - self.capacity)

    @property
    def busy_sessions(self) -> int:
        return sum(1 for count in self._outstanding if count)

    @property
    def service_rate(self) -> float | None:
        """Segments answered per second while the sessions had work, over the last `RATE_WINDOW` answers; None
        before the first."""
        seconds = sum(busy for _, busy in self._answered)
        return sum(count for count, _ in self._answered) / seconds if seconds > 0 else None

    def _record_answer(self, segments: int) -> None:
        now = time.monotonic()
        if self._busy_since is not None:
            self._answered.append((segments, now - self._busy_since))
        self._busy_since = now if sum(self._outstanding) else None

    def expected_wait(self, segments: int = 0) -> float | None:
        """Seconds until the waiting segments, and `segments` more, have a place in a decoder batch, at
        `service_rate` (each answer frees a place); 0 while there are places for them all."""
        waiting = sum(self._outstanding) + segments - self.capacity
        if waiting <= 0:
            return 0.0
        rate = self.service_rate
        return None if rate is None else waiting / rate

    async def start(self) -> None:
        self._started = True

    def submit(self, texts: list[str], admitted: bool = False) -> list[asyncio.Future]:
        """One request's segments to the least busy session; a future per segment (its translation). Raises
        `QueueFull`, `Overloaded` or `ShuttingDown`; nothing is submitted then. A request is always admitted when
        its segments find places; `admitted`: more work of a request admitted before (a placeholder retry), never
        refused while sessions run, and put before the segments waiting for a place."""
        if (self._closing and not admitted) or not self._started:
            raise ShuttingDown("the server is shutting down")
        if not admitted and self.queue_depth + len(texts) > self.max_queue:
            raise QueueFull(f"{self.queue_depth} segments wait already, the most is {self.max_queue}")
        wait = None if admitted else self.expected_wait(len(texts))
        if self.max_queue_seconds is not None and wait is not None and wait > self.max_queue_seconds:
            raise Overloaded(
                f"the waiting work takes {wait:.1f} s at the measured rate, over {self.max_queue_seconds:g} s",
                retry_after=max(1, math.ceil(wait - self.max_queue_seconds)),
            )
        loop = asyncio.get_running_loop()
        sources = self.engine.encode(list(texts))
        session = min(range(len(self._outstanding)), key=self._outstanding.__getitem__)
        if not sum(self._outstanding):
            self._busy_since = time.monotonic()
        self._outstanding[session] += len(sources)
        futures = [loop.create_future() for _ in sources]
        submitted = time.perf_counter()
        answer = self.engine.translators[session].submit(sources, first=admitted)  # a retry waited once already

        def done(future: Future) -> None:
            loop.call_soon_threadsafe(self._answer, session, sources, futures, future, submitted)

        answer.add_done_callback(done)
        return futures

    def _answer(self, session: int, sources, futures: list[asyncio.Future], answer: Future, submitted: float) -> None:
        self._outstanding[session] -= len(sources)
        self._record_answer(len(sources))
        error = answer.exception()
        if error is not None:
            for future in futures:
                if not future.done():
                    future.set_exception(error)
            return
        output = answer.result()
        tokenizer, pad = self.engine.tokenizer, self.engine.pad_id
        texts = [text.strip() for text in tokenizer.decode_batch(output.tolist(), skip_special_tokens=True)]
        for future, text in zip(futures, texts, strict=True):
            if not future.done():  # its request may have gone away meanwhile
                future.set_result(text)
        if self.on_batch is not None:
            generated = int((output[:, 1:] != pad).sum())
            source_tokens = len(sources) * max(len(ids) for ids in sources)
            self.on_batch(BatchStats(len(sources), source_tokens, generated, time.perf_counter() - submitted))
        if self.on_steps is not None:
            self.on_steps(self.engine.translators[session].take_stats())

    async def close(self) -> None:
        """Refuse new work and wait until everything submitted is answered (the sessions are closed by the
        service)."""
        self._closing = True
        while sum(self._outstanding):
            await asyncio.sleep(0.005)
