"""Worker processes that each hold one `OrtTranslator` of an export folder: the pool behind bulk translation's
`--workers` (`bulk.py`) and the server's session processes (`serve/workers.py`).

The processes are spawned: fresh interpreters on every platform, with no copy of the parent's threads or onnxruntime
state. Each loads its translator in the pool's initializer; an error there is kept and raised by the process's
first task, so that the parent sees the exception itself rather than a broken pool.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor

from .folder import ExportFolder

# This process's translator (in a pool's worker), and the error that kept it from loading.
_translator = None
_load_error: Exception | None = None


def start_translator_pool(
    folder: ExportFolder, workers: int, provider: str, threads: int, *, shielded: bool = False
) -> ProcessPoolExecutor:
    """A pool of `workers` spawned processes, each loading an `OrtTranslator` of `folder` as it starts.

    Args:
        folder: the export folder, read and checked here already (each process reads it again for itself).
        workers: processes in the pool.
        provider: onnxruntime provider of their sessions ("auto", "cpu", "cuda").
        threads: intra-op threads of each process's sessions.
        shielded: the processes ignore SIGINT and SIGTERM (a Ctrl-C reaches the whole process group, and systemd
            signals every process of a service: a server decides itself when its sessions end, after the batches
            in flight), and each ends once this process is gone (killed with SIGKILL, so that it could not close
            them).
    """
    return ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_load,
        initargs=(str(folder.path), provider, threads, os.getpid() if shielded else None),
    )


def _exit_with(parent: int, interval: float = 1.0) -> None:
    """End this process once `parent` is gone: the process then has another parent. A worker holds both ends of the
    pool's queues, so it would never read an end of file there."""
    while os.getppid() == parent:
        time.sleep(interval)
    os._exit(0)


# How much lower than the server a session process runs: decoding takes whatever CPU is left, and the server's own
# process (parsing, admission, answers: little work, but on every request's path) is never starved by it.
SESSION_NICENESS = 5


def shield(parent: int) -> None:
    """In a server's child process: ignore SIGINT and SIGTERM (the server decides when its sessions end, after the
    work in flight), end once `parent` is gone (killed with SIGKILL, so that it could not close them), and run
    `SESSION_NICENESS` lower than the server."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    if hasattr(os, "nice"):
        os.nice(SESSION_NICENESS)
    threading.Thread(target=_exit_with, args=(parent,), name="vt-parent-watch", daemon=True).start()


def _load(folder: str, provider: str, threads: int, parent: int | None) -> None:
    """Pool initializer: shield the process when `parent` is given, then load the folder's translator."""
    global _translator, _load_error
    if parent is not None:
        shield(parent)
    from .translator import OrtTranslator

    try:
        _translator = OrtTranslator(folder, provider=provider, intra_op_num_threads=threads)
    except Exception as error:  # kept for the parent: the first task raises it
        _load_error = error


def worker_translator():
    """This worker's `OrtTranslator`; raises the error that kept it from loading."""
    if _load_error is not None:
        raise _load_error
    return _translator


def worker_pid() -> int:
    """This worker's process id, once its translator has loaded (the error that kept it from loading otherwise)."""
    worker_translator()
    return os.getpid()
