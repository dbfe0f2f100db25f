"""Session processes: each onnxruntime session of the server in a process of its own.

A batch's beam search runs a Python step between its onnxruntime calls, and the event loop parses requests in
Python too. In one process these take turns on one interpreter lock: on 2 cores, two session threads translated 242
unsorted test sentences/s in batches of 8, two processes 2 x 176 (docs/serving.md). `SessionProcess` runs an
`OrtTranslator` in a child process and offers, in the server's process, the part of its interface the batch
scheduler uses: `tokenizer`, `settings` and `config` (read from the folder, no session loaded here) and `generate`
(run in the child, blocking the calling worker thread only, which waits without holding the lock).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout  # the builtin TimeoutError from Python 3.11
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import numpy as np

from ..contract import CONFIG_FILE
from ..translator import load_tokenizer, settings_from_folder
from .batching import SessionLost

logger = logging.getLogger(__name__)

# The child's translator, and the error that kept it from loading (raised by every call, starting with `_loaded`).
_translator = None
_load_error: Exception | None = None


def _exit_with(parent: int, interval: float = 1.0) -> None:
    """End this process once `parent` is gone (killed with SIGKILL, say, so that it could not close its sessions):
    the child then has another parent. A child holds both ends of the pool's queues, so it would never read an
    end of file there."""
    while os.getppid() == parent:
        time.sleep(interval)
    os._exit(0)


def _start_child(folder: str, provider: str, threads: int, parent: int) -> None:
    """Process initializer: ignore SIGINT and SIGTERM (a Ctrl-C reaches the whole process group, and systemd signals
    every process of a service: the server itself decides when its sessions end, after the batches in flight), watch
    for the end of the server's process, then load the folder's sessions."""
    global _translator, _load_error
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    threading.Thread(target=_exit_with, args=(parent,), name="vt-parent-watch", daemon=True).start()
    from ..translator import OrtTranslator

    try:
        _translator = OrtTranslator(folder, provider=provider, intra_op_num_threads=threads)
    except Exception as error:  # kept for the parent, which asks `_loaded` and reports it
        _load_error = error


def _loaded() -> int:
    if _load_error is not None:
        raise _load_error
    return os.getpid()


def _generate(input_ids: np.ndarray, attention_mask: np.ndarray | None, overrides: dict) -> np.ndarray:
    if _load_error is not None:
        raise _load_error
    return _translator.generate(input_ids, attention_mask, **overrides)


class SessionProcess:
    """An `OrtTranslator` of `folder` in a child process (spawned: a fresh interpreter on every platform).

    Args:
        folder: the export folder.
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
        folder: str | os.PathLike,
        provider: str = "cpu",
        intra_op_num_threads: int = 1,
        start_timeout: float = 300.0,
        wait: bool = True,
    ):
        self.folder = Path(folder)
        self.tokenizer = load_tokenizer(self.folder)
        self.settings = settings_from_folder(self.folder)
        self.config = json.loads((self.folder / CONFIG_FILE).read_text())
        self._arguments = (str(self.folder), provider, intra_op_num_threads, os.getpid())
        self._start_timeout = start_timeout
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None
        self._loading: Future | None = None
        self.pid: int | None = None
        self._start()
        if wait:
            self.wait_loaded()

    def _start(self) -> None:
        self._pool = ProcessPoolExecutor(
            max_workers=1,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start_child,
            initargs=self._arguments,
        )
        self._loading = self._pool.submit(_loaded)

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
    folder: str | os.PathLike, count: int, provider: str = "cpu", intra_op_num_threads: int = 1
) -> list[SessionProcess]:
    """`count` session processes of `folder`, loading side by side; ValueError (and none left running) if one
    cannot load."""
    sessions = [SessionProcess(folder, provider, intra_op_num_threads, wait=False) for _ in range(count)]
    try:
        for session in sessions:
            session.wait_loaded()
    except ValueError:
        for session in sessions:
            session.close()
        raise
    return sessions
