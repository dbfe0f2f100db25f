"""tests/exit_watchdog.py: a run whose interpreter cannot exit fails within the grace period, saying why."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# A program that cannot exit: a daemonic child that ignores SIGTERM, which multiprocessing's exit handler sends to
# daemonic children before waiting for them, and ends only once its parent is gone (as the server's session processes
# do).
STUCK = """
import multiprocessing, os, signal, sys, time
sys.path.insert(0, ROOT)
from tests import exit_watchdog

def ignore_sigterm_until_the_parent_is_gone(ready, parent):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready.set()
    while os.getppid() == parent:
        time.sleep(0.1)

if __name__ == "__main__":
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    child = context.Process(target=ignore_sigterm_until_the_parent_is_gone, args=(ready, os.getpid()), daemon=True)
    child.start()
    ready.wait(60)
    exit_watchdog.start(grace=GRACE, status=3)
"""


def run(tmp_path: Path, code: str, grace: float) -> subprocess.CompletedProcess:
    script = tmp_path / "program.py"  # a file: spawned children import the program's functions from it
    script.write_text(code.replace("ROOT", repr(str(ROOT))).replace("GRACE", str(grace)))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)


def test_an_interpreter_that_cannot_exit_is_ended_with_what_holds_it(tmp_path):
    result = run(tmp_path, STUCK, grace=3)
    assert result.returncode == 3, result.stderr[-2000:]
    assert "did not exit within 3 s" in result.stderr and "SpawnProcess-1" in result.stderr, result.stderr[-2000:]
    assert "_exit_function" in result.stderr  # the main thread's stack: multiprocessing's exit handler, joining


def test_an_interpreter_that_exits_is_left_alone(tmp_path):
    code = "import sys\nsys.path.insert(0, ROOT)\nfrom tests import exit_watchdog\nexit_watchdog.start(grace=GRACE)\n"
    result = run(tmp_path, code, grace=3)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr == ""
