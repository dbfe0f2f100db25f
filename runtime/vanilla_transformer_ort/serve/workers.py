"""Session processes: each onnxruntime session of the server in a process of its own.

A batch's beam search runs a Python step between its onnxruntime calls, and the event loop parses requests in
Python too. In one process these take turns on one interpreter lock, so each session gets a process of its own
(measured in docs/experiments/serving-runs.md). `SessionProcess` runs an
`OrtTranslator` in a child process and offers, in the server's process, the part of its interface the batch
scheduler uses: `tokenizer`, `settings` and `config` (read from the folder, no session loaded here) and `generate`
(run in the child, blocking the calling worker thread only, which waits without holding the lock).

For step-level batching (`--step_batching`), `StepSessionProcess` runs a `StepBatcher` in a child process the same
way (`StepSession` in this process): `submit` sends a request's sources and returns a future of their output ids,
and the child answers each request as its sentences finish, while others join its running batch.
"""

from __future__ import annotations

import logging
import multiprocessing.util
import os
import threading
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout  # the builtin TimeoutError from Python 3.11
from concurrent.futures.process import BrokenProcessPool

import numpy as np

from ..folder import ExportFolder
from ..worker_pool import start_translator_pool, worker_pid, worker_translator
from .batching import SessionLost

logger = logging.getLogger(__name__)


def _generate(input_ids: np.ndarray, attention_mask: np.ndarray | None, overrides: dict) -> np.ndarray:
    return worker_translator().generate(input_ids, attention_mask, **overrides)


def _shut_down(pool: ProcessPoolExecutor) -> None:
    pool.shutdown(wait=True, cancel_futures=True)


class SessionProcess:
    """An `OrtTranslator` of `folder` in a child process (spawned: a fresh interpreter on every platform).

    Args:
        folder: the export folder (a path, or an `ExportFolder` already read).
        provider: onnxruntime provider ("cpu", "cuda", "auto").
        intra_op_num_threads: threads of the child's session.
        start_timeout: seconds the child may take to load the folder.
        wait: wait for the child to load here; False leaves it to `wait_loaded` (`start_sessions` loads several
            side by side).
    Raises:
        ValueError: the child could not load the folder (the message names the folder and the reason).
    """

    def __init__(
        self,
        folder: str | os.PathLike | ExportFolder,
        provider: str = "cpu",
        intra_op_num_threads: int = 1,
        start_timeout: float = 300.0,
        wait: bool = True,
    ):
        self.export_folder = ExportFolder.of(folder)
        self.folder = self.export_folder.path
        self.tokenizer = self.export_folder.tokenizer
        self.settings = self.export_folder.settings
        self.config = self.export_folder.config
        self._provider, self._threads = provider, intra_op_num_threads
        self._start_timeout = start_timeout
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None
        self._loading: Future | None = None
        self.pid: int | None = None
        self._start()
        if wait:
            self.wait_loaded()

    def _start(self) -> None:
        self._pool = start_translator_pool(self.export_folder, 1, self._provider, self._threads, shielded=True)
        # A pool left open is shut down while the interpreter can still do it: collected at its teardown instead,
        # concurrent.futures prints an AttributeError of its own.
        multiprocessing.util.Finalize(self, _shut_down, args=(self._pool,), exitpriority=10)
        self._loading = self._pool.submit(worker_pid)

    def wait_loaded(self) -> None:
        """Wait until the child has loaded the folder; ValueError (and the child ended) if it could not."""
        try:
            self.pid = self._loading.result(timeout=self._start_timeout)
        except BrokenProcessPool:
            reason = (
                "its process exited while loading (its error is on stderr; a script that starts sessions must do "
                "so under `if __name__ == '__main__':`, as Python's spawned processes require, or use "
                "session_workers='thread')"
            )
        except FutureTimeout:
            reason = f"it took over {self._start_timeout:g} s to load"
        except Exception as error:
            reason = f"{type(error).__name__}: {error}"
        else:
            return
        self.close()
        raise ValueError(f"{self.folder}: the session could not be started: {reason}")

    def generate(self, input_ids: np.ndarray, attention_mask: np.ndarray | None = None, **overrides) -> np.ndarray:
        """`OrtTranslator.generate`, run in the child. A child that died (killed, out of memory) fails this batch
        with `SessionLost` and is replaced for the next one."""
        with self._lock:
            if self._pool is None:
                raise RuntimeError("the session process was closed")
            try:
                return self._pool.submit(_generate, input_ids, attention_mask, overrides).result()
            except BrokenProcessPool:
                logger.error("The session process of %s exited during a batch; starting a new one", self.folder)
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._start()
                self.wait_loaded()
                raise SessionLost(
                    "the session process ended before finishing this batch; a new one was started"
                ) from None

    def close(self) -> None:
        """End the child, after the batch it runs, if any."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def __reduce__(self):
        raise TypeError("a SessionProcess belongs to the process that started it and cannot be pickled")


def start_sessions(
    folder: str | os.PathLike | ExportFolder, count: int, provider: str = "cpu", intra_op_num_threads: int = 1
) -> list[SessionProcess]:
    """`count` session processes of `folder`, loading side by side; ValueError (and none left running) if one
    cannot load."""
    folder = ExportFolder.of(folder)
    sessions = [SessionProcess(folder, provider, intra_op_num_threads, wait=False) for _ in range(count)]
    try:
        for session in sessions:
            session.wait_loaded()
    except ValueError:
        for session in sessions:
            session.close()
        raise
    return sessions


# -- step-level batching ----------------------------------------------------------------------------------------------


class StepSession:
    """A `StepBatcher` of `folder` in this process (`session_workers="thread"`): `submit(sources)` returns a
    `concurrent.futures.Future` of the output ids, as `StepSessionProcess` does from a child process.

    `tokenizer`, `settings` and `config` are the folder's; `take_stats` gives the decoder steps since it was last
    called."""

    def __init__(self, folder, provider: str, intra_op_num_threads: int, max_sentences: int, overrides: dict):
        from ..step_batching import StepBatcher
        from ..translator import OrtTranslator

        translator = OrtTranslator(folder, provider=provider, intra_op_num_threads=intra_op_num_threads)
        self.tokenizer, self.settings, self.config = translator.tokenizer, translator.settings, translator.config
        self.batcher = StepBatcher(translator, max_sentences, **overrides)

    def submit(self, sources: list[list[int]], first: bool = False) -> Future:
        return self.batcher.submit(sources, first)

    def take_stats(self):
        return self.batcher.take_stats()

    def close(self) -> None:
        self.batcher.close()


def _step_session_main(folder: str, provider: str, threads: int, max_sentences: int, overrides: dict, jobs, results,
                       parent: int) -> None:  # fmt: skip
    """A step session's child process: one `StepBatcher`; jobs `(id, sources, first)` in, `(id, output, error,
    stats)` out; None ends it once everything submitted is answered."""
    from ..worker_pool import shield

    shield(parent)
    try:
        session = StepSession(folder, provider, threads, max_sentences, overrides)
    except Exception as error:
        results.put(("loaded", None, f"{type(error).__name__}: {error}", None))
        return
    results.put(("loaded", os.getpid(), None, None))

    def answer(job: int, future: Future) -> None:
        error = future.exception()
        output = None if error is not None else future.result()
        message = None if error is None else f"{type(error).__name__}: {error}"
        results.put((job, output, message, session.take_stats()))

    while (item := jobs.get()) is not None:
        job, sources, first = item
        try:
            session.submit(sources, first).add_done_callback(lambda future, job=job: answer(job, future))
        except Exception as error:
            results.put((job, None, f"{type(error).__name__}: {error}", None))
    session.close()
    results.put(("closed", None, None, None))


def _kill(process) -> None:
    if process.is_alive():
        process.kill()
        process.join(timeout=10)


class StepSessionProcess:
    """A `StepSession` in a child process of its own (spawned), as `SessionProcess` is for request-level batches:
    no step's Python waits for the event loop's on one interpreter lock. A child that dies fails what it was
    translating with `SessionLost`, and a new one is started for the next submission."""

    def __init__(self, folder, provider: str, intra_op_num_threads: int, max_sentences: int, overrides: dict,
                 start_timeout: float = 300.0):  # fmt: skip
        self.export_folder = ExportFolder.of(folder)
        self.folder = self.export_folder.path
        self.tokenizer, self.settings = self.export_folder.tokenizer, self.export_folder.settings
        self.config = self.export_folder.config
        self._arguments = (str(self.folder), provider, intra_op_num_threads, max_sentences, overrides)
        self._context = multiprocessing.get_context("spawn")
        self._start_timeout = start_timeout
        self._lock = threading.Lock()
        self._futures: dict[int, Future] = {}
        self._next_job = 0
        self._stats: list = []
        self._closed = False
        self._start()

    def _start(self) -> None:
        self._jobs, self._results = self._context.Queue(), self._context.Queue()
        self._process = self._context.Process(
            target=_step_session_main, args=(*self._arguments, self._jobs, self._results, os.getpid()), daemon=True
        )
        self._process.start()
        # The child ignores SIGTERM (`shield`), so multiprocessing's exit handler, which terminates daemonic
        # children and then joins them, would wait forever for one left open: end it with SIGKILL first, as it
        # would end once this process is gone. The same when this object is collected without `close`.
        multiprocessing.util.Finalize(self, _kill, args=(self._process,), exitpriority=10)
        try:
            _, pid, error, _ = self._results.get(timeout=self._start_timeout)
        except Exception:
            pid, error = None, f"it did not load within {self._start_timeout:g} s"
        if error is not None:
            self._process.kill()
            raise ValueError(f"{self.folder}: the step session could not be started: {error}")
        self.pid = pid
        self._reader = threading.Thread(target=self._read, name="vt-step-results", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        """Resolve the futures from the child's answers; fail the outstanding ones if it dies."""
        while True:
            try:
                job, output, error, stats = self._results.get(timeout=1.0)
            except Exception:  # queue.Empty: check that the child is alive
                if self._process.is_alive():
                    continue
                with self._lock:
                    lost, self._futures = list(self._futures.values()), {}
                for future in lost:
                    future.set_exception(SessionLost("the step session's process ended; a new one is started"))
                return
            if job == "closed":
                return
            if stats is not None:
                self._stats.append(stats)
            with self._lock:
                future = self._futures.pop(job, None)
            if future is None:
                continue
            if error is not None:
                future.set_exception(RuntimeError(error))
            else:
                future.set_result(output)

    def submit(self, sources: list[list[int]], first: bool = False) -> Future:
        future: Future = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the step session process was closed")
            if not self._process.is_alive():
                logger.error("The step session process of %s ended; starting a new one", self.folder)
                self._start()
            job, self._next_job = self._next_job, self._next_job + 1
            self._futures[job] = future
        self._jobs.put((job, [list(map(int, ids)) for ids in sources], first))
        return future

    def take_stats(self):
        """The decoder steps the child reported since the last call (summed)."""
        from ..step_batching import StepStats

        taken, self._stats = self._stats, []
        total = StepStats()
        for stats in taken:
            total.steps, total.rows, total.seconds = total.steps + stats.steps, total.rows + stats.rows, \
                total.seconds + stats.seconds  # fmt: skip
        return total

    def close(self) -> None:
        """End the child once everything submitted is answered; later submissions raise RuntimeError."""
        with self._lock:
            self._closed = True
        if self._process.is_alive():
            self._jobs.put(None)
            self._reader.join()
        self._process.join(timeout=10)
        if self._process.is_alive():
            self._process.kill()

    def __reduce__(self):
        raise TypeError("a StepSessionProcess belongs to the process that started it and cannot be pickled")


def start_step_sessions(folder, count: int, provider: str, intra_op_num_threads: int, max_sentences: int,
                        overrides: dict, processes: bool = True) -> list:  # fmt: skip
    """`count` step sessions of `folder`: `StepSessionProcess`es, or `StepSession`s in this process where
    `processes` is False; none is left running if one cannot start."""
    kind = StepSessionProcess if processes else StepSession
    sessions = []
    try:
        for _ in range(count):
            sessions.append(kind(folder, provider, intra_op_num_threads, max_sentences, overrides))
    except BaseException:
        for session in sessions:
            session.close()
        raise
    return sessions
