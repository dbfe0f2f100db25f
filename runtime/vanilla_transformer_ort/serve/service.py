"""The translation service behind the HTTP API: the served pairs, their batch schedulers and the metrics.

`TranslationService` is independent of the web framework: the FastAPI app (`app.py`) and the Ray Serve deployment
(`ray_serve.py`) both call `translate`. A request's texts are cut into segments (`text.py`; an HTML sentence with its
inline tags), identical segments of one request are translated once, every segment goes through its pair's
`BatchScheduler`, and the translations are put back between the copied pieces.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from ..placeholders import protect, restore
from ..protected_translation import DEFAULT_RETRY, DEFAULT_STYLE, translate_protected
from .batching import BatchScheduler, BatchStats, Engine, Overloaded, QueueFull, SessionLost, ShuttingDown
from .models import ModelSpec, batch_dependent, language_name
from .settings import ServeSettings
from .step_scheduling import StepScheduler, step_level
from .text import join, split

logger = logging.getLogger(__name__)

# Threads for the placeholder retries of admitted requests (each waits on the scheduler, not on the CPU).
RETRY_THREADS = 256
T = TypeVar("T")


class RequestError(Exception):
    """A client error: `status` and a one-line message, answered as LibreTranslate does (`{"error": message}`)."""

    def __init__(self, status: int, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after  # seconds, for the Retry-After header of a 429 or 503


@dataclass
class ServedPair:
    spec: ModelSpec
    engine: Engine
    scheduler: BatchScheduler | StepScheduler


class Metrics:
    """Prometheus metrics in a registry of their own (several apps can live in one process, as in tests)."""

    def __init__(self):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self.requests = Counter(
            "vt_requests", "HTTP requests by endpoint and status.", ["endpoint", "status"], registry=self.registry
        )
        self.latency = Histogram(
            "vt_request_duration_seconds",
            "Time from a request's arrival to its answer.",
            ["endpoint"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "vt_batch_size",
            "Segments in each onnxruntime batch.",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=self.registry,
        )
        self.batch_seconds = Histogram(
            "vt_batch_duration_seconds",
            "Decoding time of each batch.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.segments = Counter("vt_segments_translated", "Segments translated.", registry=self.registry)
        self.tokens = Counter(
            "vt_generated_tokens", "Target tokens generated (rate() gives tokens/s).", registry=self.registry
        )
        self.tokens_per_second = Gauge(
            "vt_batch_tokens_per_second", "Generated tokens per second of the latest batch.", registry=self.registry
        )
        self.queue_depth = Gauge("vt_queue_depth", "Segments waiting for a batch, all pairs.", registry=self.registry)
        self.busy_sessions = Gauge("vt_busy_sessions", "Sessions running a batch, all pairs.", registry=self.registry)
        self.rejected = Counter(
            "vt_rejected_requests",
            "Requests refused before any work: queue_full (429), overloaded (503, admission control).",
            ["reason"],
            registry=self.registry,
        )
        self.expected_wait = Gauge(
            "vt_expected_wait_seconds",
            "Longest time, over the pairs, until the queued segments have started, at the measured service rate.",
            registry=self.registry,
        )

        self.decoder_steps = Counter(
            "vt_decoder_steps", "Decoder steps of step-level batching (--step_batching).", registry=self.registry
        )
        self.decoder_step_rows = Counter(
            "vt_decoder_step_rows",
            "Rows (sources x beams) summed over the decoder steps: over vt_decoder_steps, the batch's mean occupancy.",
            registry=self.registry,
        )
        self.step_rows = Gauge(
            "vt_step_rows", "Mean rows per decoder step since the previous answer (step-level batching).",
            registry=self.registry,
        )  # fmt: skip
        self.untranslated = Counter(
            "vt_untranslated_segments",
            "Segments returned untranslated because no translation kept all their placeholders.",
            registry=self.registry,
        )

    def observe_steps(self, stats) -> None:
        """A step session's `StepStats`: decoder steps and the rows they ran."""
        if stats.steps:
            self.decoder_steps.inc(stats.steps)
            self.decoder_step_rows.inc(stats.rows)
            self.step_rows.set(stats.rows / stats.steps)

    def observe_batch(self, stats: BatchStats) -> None:
        self.batch_size.observe(stats.size)
        self.batch_seconds.observe(stats.seconds)
        self.segments.inc(stats.size)
        self.tokens.inc(stats.generated_tokens)
        if stats.seconds > 0:
            self.tokens_per_second.set(stats.generated_tokens / stats.seconds)


def load_translators(spec: ModelSpec, settings: ServeSettings) -> list:
    """`settings.sessions` sessions of the folder, each on `settings.threads_per_session` threads: `SessionProcess`es
    (each in a process of its own, `session_workers="process"`) or `OrtTranslator`s in this process ("thread")."""
    from ..translator import OrtTranslator

    folder = spec.export_folder
    if settings.batching and batch_dependent(folder):
        logger.warning(
            "%s quantizes int8 activations with one range per tensor: a text's translation can depend on the requests "
            "batched with it. Re-export it with vt-export-onnx --quantize int8 (one range per row, the default), or "
            "serve it with --no_batching",
            spec.folder,
        )
    if step_level(folder, settings):
        from .workers import start_step_sessions

        options = {"num_beams": settings.num_beams, "max_new_tokens": settings.max_new_tokens}
        options = {name: value for name, value in options.items() if value is not None}
        return start_step_sessions(
            folder, settings.sessions, settings.provider, settings.threads_per_session, settings.step_batch_size,
            options, processes=settings.session_workers == "process",
        )  # fmt: skip
    if settings.session_workers == "process":
        from .workers import start_sessions

        return start_sessions(folder, settings.sessions, settings.provider, settings.threads_per_session)
    return [
        OrtTranslator(folder, provider=settings.provider, intra_op_num_threads=settings.threads_per_session)
        for _ in range(settings.sessions)
    ]


class TranslationService:
    """The served pairs and everything a request needs; `start` and `close` run on the serving event loop.

    Args:
        specs: the pairs to serve.
        settings: limits, batching and sessions.
        load: builds a pair's translators (default `load_translators`; tests pass their own).
    """

    def __init__(
        self,
        specs: Sequence[ModelSpec],
        settings: ServeSettings,
        load: Callable[[ModelSpec, ServeSettings], list] = load_translators,
    ):
        if not specs:
            raise ValueError("no model to serve: pass at least one export folder")
        self.specs = list(specs)
        self.settings = settings
        self.load = load
        self.metrics = Metrics()
        self.pairs: dict[tuple[str, str], ServedPair] = {}
        self.ready = False
        self.draining = False
        self._retries = ThreadPoolExecutor(max_workers=RETRY_THREADS, thread_name_prefix="vt-retry")

    # -- life cycle ---------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load every pair's sessions (in a thread: the event loop keeps answering /health) and start batching."""
        for spec in self.specs:
            translators = await asyncio.to_thread(self.load, spec, self.settings)
            options = {"num_beams": self.settings.num_beams, "max_new_tokens": self.settings.max_new_tokens}
            engine = Engine(translators, options)
            steps = step_level(spec.export_folder, self.settings)
            if steps:
                scheduler = StepScheduler(
                    engine,
                    max_sentences=self.settings.step_batch_size,
                    max_queue=self.settings.max_queue,
                    max_queue_seconds=self.settings.max_queue_seconds,
                    on_batch=self.metrics.observe_batch,
                    on_steps=self.metrics.observe_steps,
                )
            else:
                scheduler = BatchScheduler(
                    engine,
                    max_batch_tokens=self.settings.max_batch_tokens,
                    max_batch_size=self.settings.max_batch_size,
                    max_wait_ms=self.settings.max_wait_ms,
                    max_queue=self.settings.max_queue,
                    max_queue_seconds=self.settings.max_queue_seconds,
                    cross_request=self.settings.batching,
                    on_batch=self.metrics.observe_batch,
                )
            await scheduler.start()
            self.pairs[(spec.source, spec.target)] = ServedPair(spec, engine, scheduler)
            logger.info(
                "Serving %s from %s (%d session(s) x %d thread(s), %s batching)",
                spec.pair,
                spec.folder,
                len(translators),
                self.settings.threads_per_session,
                "step-level" if steps else "request-level" if self.settings.batching else "no",
            )
        self.ready = True

    def begin_draining(self) -> None:
        """Refuse new translations from now on (SIGTERM); what is queued or running still completes."""
        self.draining = True

    async def close(self) -> None:
        """Finish every queued and running batch, then stop the workers."""
        self.draining = True
        self.ready = False
        await asyncio.gather(*(pair.scheduler.close() for pair in self.pairs.values()))
        self._retries.shutdown(wait=False)
        for pair in self.pairs.values():  # session processes end once their last batch is done
            for translator in pair.engine.translators:
                if callable(getattr(translator, "close", None)):
                    await asyncio.to_thread(translator.close)

    def update_gauges(self) -> None:
        self.metrics.queue_depth.set(sum(p.scheduler.queue_depth for p in self.pairs.values()))
        self.metrics.busy_sessions.set(sum(p.scheduler.busy_sessions for p in self.pairs.values()))
        self.metrics.expected_wait.set(
            max((p.scheduler.expected_wait() or 0.0 for p in self.pairs.values()), default=0)
        )

    # -- languages ----------------------------------------------------------------------------------------------

    def languages(self) -> list[dict]:
        """LibreTranslate's `/languages`: every served language with the targets it translates into."""
        targets: dict[str, list[str]] = {}
        for spec in self.specs:
            targets.setdefault(spec.source, []).append(spec.target)
            targets.setdefault(spec.target, [])
        return [{"code": code, "name": language_name(code), "targets": sorted(targets[code])} for code in targets]

    def resolve_pair(self, source: str, target: str) -> tuple[str, bool]:
        """(source code, whether it was resolved from "auto"); RequestError 400 for an unknown pair."""
        served = ", ".join(spec.pair for spec in self.specs)
        if source == "auto":
            sources = sorted({spec.source for spec in self.specs if spec.target == target})
            if len(sources) == 1:
                return sources[0], True
            if not sources:
                raise RequestError(400, f"target {target!r} is not served; served pairs: {served}")
            raise RequestError(
                400, f"source 'auto' is ambiguous for target {target!r} (served from {', '.join(sources)}); name it"
            )
        if (source, target) not in {(spec.source, spec.target) for spec in self.specs}:
            raise RequestError(400, f"{source}-{target} is not served; served pairs: {served}")
        return source, False

    # -- translation --------------------------------------------------------------------------------------------

    def _serving_pair(self, source: str, target: str) -> ServedPair:
        """The pair's batch scheduler; RequestError 503 while loading or shutting down."""
        if self.draining:
            raise RequestError(503, "the server is shutting down; retry on another instance")
        if not self.ready:
            raise RequestError(503, "the models are still loading; retry shortly")
        return self.pairs[(source, target)]

    async def translate(
        self, texts: list[str], source: str, target: str, text_format: str, chunk_size: int | None = None
    ) -> list[str]:
        """Translate `texts` (already validated) from `source` to `target`; `text_format` is "text" or "html".

        With `chunk_size`, the distinct segments are queued that many at a time, each chunk within its own
        `request_timeout`: a file of thousands of lines then takes its turn with other requests instead of filling
        the queue (a 429) or running past the timeout (a 503)."""
        pair = self._serving_pair(source, target)
        cut = [split(text, text_format) for text in texts]
        segments = list(dict.fromkeys(piece.source for pieces in cut for piece in pieces if piece.translate))
        if not segments:
            return [join(pieces, []) for pieces in cut]
        protect = self.settings.protect_placeholders or text_format == "html"  # HTML keeps its tags always
        translate = self._translate_protected if protect else self._translate_segments
        step = chunk_size or len(segments)
        translations = []
        for start in range(0, len(segments), step):
            translations += await translate(pair, segments[start : start + step])
        by_segment = dict(zip(segments, translations, strict=True))
        return [join(pieces, [by_segment[p.source] for p in pieces if p.translate]) for pieces in cut]

    async def _translate_segments(self, pair: ServedPair, segments: list[str], admitted: bool = False) -> list[str]:
        """The model's translations of `segments`, through the pair's batch scheduler. `admitted`: more work of a
        request admitted already (a placeholder retry), which admission control does not refuse."""
        try:
            futures = pair.scheduler.submit(segments, admitted=admitted)
        except QueueFull as error:
            self.metrics.rejected.labels("queue_full").inc()
            raise RequestError(429, f"too many requests are waiting ({error}); slow down") from None
        except Overloaded as error:
            self.metrics.rejected.labels("overloaded").inc()
            raise RequestError(503, f"the server is at capacity ({error}); retry later", error.retry_after) from None
        except ShuttingDown:
            raise RequestError(503, "the server is shutting down; retry on another instance") from None
        self.update_gauges()
        try:
            return list(await asyncio.wait_for(asyncio.gather(*futures), self.settings.request_timeout))
        except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
            raise RequestError(
                503,
                f"no translation within {self.settings.request_timeout:g} s (the server is overloaded); "
                "retry later or send fewer texts",
            ) from None
        except SessionLost:
            raise RequestError(
                503, "a translation session ended during this request and was restarted; retry"
            ) from None
        finally:
            for future in futures:  # a request that goes away takes its queued segments with it
                future.cancel()
            self.update_gauges()

    async def _translate_protected(self, pair: ServedPair, segments: list[str]) -> list[str]:
        """Translations that keep every placeholder of their segment (`%s`, `{0}`, `<b>`, `&amp;`, URLs, ...).

        As `protected_translation.translate_protected` does it (its order of attempts is the one measured best in
        docs/localization.md): first the segment as it is, verified; a segment whose translation lost, duplicated
        or invented a placeholder is retried with its placeholders masked, then piece by piece (in a worker thread,
        its batches still going through the scheduler); a segment that fails them all comes back untranslated,
        never broken. The first pass is awaited here, so most requests never leave the event loop.
        """
        protected = [protect(segment, style=DEFAULT_STYLE) for segment in segments]
        wanted = list(dict.fromkeys(p.masked for p in protected if p.is_translatable))
        raw = dict(zip(wanted, await self._translate_segments(pair, wanted), strict=True)) if wanted else {}
        translations: list[str | None] = []
        for segment, item in zip(segments, protected, strict=True):
            translations.append(restore(raw[item.masked], item) if item.is_translatable else segment)
        failing = [index for index, translation in enumerate(translations) if translation is None]
        if failing:
            retry = functools.partial(
                translate_protected,
                self._blocking_translate_batch(pair, asyncio.get_running_loop(), admitted=True),
                [segments[index] for index in failing],
                style=DEFAULT_RETRY[0],  # the first attempt, as it is, was made above
                retry=DEFAULT_RETRY[1:],
            )
            # Threads of their own: a retry waits on the scheduler, and asyncio's default pool (a few threads)
            # would queue the retries of an admitted request behind each other, outside admission control.
            results = await asyncio.get_running_loop().run_in_executor(self._retries, retry)
            for index, result in zip(failing, results, strict=True):
                if result.translation is None:
                    self.metrics.untranslated.inc()
                    logger.info("Left untranslated (a placeholder did not survive): %r", segments[index][:80])
                translations[index] = result.translation if result.translation is not None else segments[index]
        return translations

    def _blocking_translate_batch(
        self, pair: ServedPair, loop: asyncio.AbstractEventLoop, admitted: bool = False
    ) -> Callable[[list[str]], list[str]]:
        """`translate_batch(texts) -> translations` for a worker thread: the texts go as they are (no segmenting, no
        placeholder protection: the caller does both) through the pair's batch scheduler on `loop`; `admitted` as in
        `_translate_segments`."""

        def translate_batch(texts: list[str]) -> list[str]:
            work = self._translate_segments(pair, list(texts), admitted=admitted)
            future = asyncio.run_coroutine_threadsafe(work, loop)
            return future.result()

        return translate_batch

    async def run_with_translator(
        self, source: str, target: str, work: Callable[[Callable[[list[str]], list[str]]], T]
    ) -> T:
        """`work(translate_batch)` in a worker thread, `translate_batch` translating through the pair's batch
        scheduler (`catalog.pretranslate` takes it, as `vt-translate-po` gives it a translator's)."""
        pair = self._serving_pair(source, target)
        return await asyncio.to_thread(work, self._blocking_translate_batch(pair, asyncio.get_running_loop()))
