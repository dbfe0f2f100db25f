"""A watchdog for the end of a test run: if the interpreter has not exited `grace` seconds after the run finished
(a child process or a thread keeps it, as a session process left open once did), it prints what is alive and every
thread's stack, and exits with `status`, rather than hanging until CI's time limit. Standard library only."""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import sys
import threading
import time

EXIT_GRACE_S = 300.0
EXIT_STATUS = 3


def start(grace: float = EXIT_GRACE_S, status: int = EXIT_STATUS) -> threading.Thread:
    """Start the watchdog (a daemon thread: it runs on while the interpreter waits at exit)."""

    def watch() -> None:
        time.sleep(grace)
        children = ", ".join(f"{p.name} (pid {p.pid})" for p in multiprocessing.active_children()) or "none"
        sys.stderr.write(
            f"\nThe tests finished, but the interpreter did not exit within {grace:g} s. Child processes alive: "
            f"{children}. Every thread's stack:\n"
        )
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(status)

    thread = threading.Thread(target=watch, name="vt-exit-watchdog", daemon=True)
    thread.start()
    return thread
