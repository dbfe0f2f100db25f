"""Session processes: each onnxruntime session of the server in a process of its own.

A batch's beam search runs a Python step between its onnxruntime calls, and the event loop parses requests in
Python too. In one process these take turns on one interpreter lock, so each session gets a process of its own
(measured in docs/experiments/serving-runs.md). `SessionProcess` runs an
`OrtTranslator` in a child process and offers, in the server's process, the part of its interface the batch
scheduler uses: `tokenizer`, `settings` and `config` (read from the folder, no session loaded here) and `generate`
(run in the child, blocking the calling worker thread only, which waits without holding the lock).
"""

from __future__ import annotations

import logging
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
