"""`SessionProcess` and `StepSessionProcess`: an `OrtTranslator` (or a `StepBatcher` of one) in a child process,
checked against the same translator in this process (the oracle), and what happens when the child is killed,
signalled, cannot load its folder, or is closed."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.onnx_helpers import SENTENCES, trained_export_dir
from vanilla_transformer_ort import OrtTranslator
from vanilla_transformer_ort.serve.batching import SessionLost
from vanilla_transformer_ort.serve.settings import ServeSettings
from vanilla_transformer_ort.serve.workers import SessionProcess, StepSessionProcess, start_sessions
from vanilla_transformer_ort.worker_pool import SESSION_NICENESS


@pytest.fixture(scope="module")
def oracle() -> OrtTranslator:
    return OrtTranslator(trained_export_dir(), provider="cpu", intra_op_num_threads=1)


@pytest.fixture(scope="module")
def session():
    session = SessionProcess(trained_export_dir(), provider="cpu", intra_op_num_threads=1)
    yield session
    session.close()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a child that ended but was not reaped yet is a zombie: gone for this purpose
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_generates_what_the_translator_generates_in_this_process(session, oracle):
    """Token ids equal the in-process translator's, greedy and beam search, on a padded batch; the tokenizer,
    settings and config the scheduler reads are the folder's, loaded here without a session."""
    input_ids, attention_mask = oracle.encode(SENTENCES)
    assert session.pid != os.getpid() and alive(session.pid)
    for options in ({"num_beams": 1}, {"num_beams": 3, "length_penalty": 0.6}, {"max_new_tokens": 3}):
        expected = oracle.generate(input_ids, attention_mask, **options)
        np.testing.assert_array_equal(session.generate(input_ids, attention_mask, **options), expected)
    assert session.settings == oracle.settings and session.config == oracle.config
    assert [e.ids for e in session.tokenizer.encode_batch(SENTENCES)] == [
        e.ids for e in oracle.tokenizer.encode_batch(SENTENCES)
    ]


def test_errors_of_a_batch_come_back_as_they_were_raised(session):
    with pytest.raises(ValueError, match="Unknown generation options"):
        session.generate(np.array([[5, 6, 2]]), np.array([[1, 1, 1]]), beams=2)
    assert session.generate(np.array([[5, 6, 2]])).shape[0] == 1  # the child serves on


def test_sigint_and_sigterm_leave_the_session_to_the_server(session, oracle):
    """A Ctrl-C reaches the whole process group and systemd signals every process of a service: the child ignores
    both, so the batches in flight finish, and ends when the server closes it."""
    pid = session.pid
    for sig in (signal.SIGINT, signal.SIGTERM):
        os.kill(pid, sig)
    time.sleep(0.2)
    input_ids, attention_mask = oracle.encode(SENTENCES[:2])
    np.testing.assert_array_equal(
        session.generate(input_ids, attention_mask), oracle.generate(input_ids, attention_mask)
    )
    assert session.pid == pid


def test_a_killed_session_fails_its_batch_and_is_replaced(oracle):
    session = SessionProcess(trained_export_dir(), intra_op_num_threads=1)
    try:
        first = session.pid
        os.kill(first, signal.SIGKILL)
        time.sleep(0.2)
        input_ids, attention_mask = oracle.encode(SENTENCES)
        with pytest.raises(SessionLost, match="session process ended"):
            session.generate(input_ids, attention_mask)
        assert session.pid != first and alive(session.pid)
        np.testing.assert_array_equal(
            session.generate(input_ids, attention_mask), oracle.generate(input_ids, attention_mask)
        )
    finally:
        session.close()


def test_a_folder_the_child_cannot_load_is_refused_by_name(tmp_path):
    """The server's own checks pass (every file is there), the child's onnxruntime fails: a ValueError names the
    folder and the reason, and no child is left running."""
    folder = tmp_path / "broken"
    shutil.copytree(trained_export_dir(), folder)
    for graph in folder.glob("decoder_model*.onnx"):
        graph.write_bytes(b"not a graph")
    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError, match="the session could not be started: .+") as error:
        start_sessions(folder, 2)
    assert str(error.value).startswith(f"{folder}: ")
    assert set(multiprocessing.active_children()) <= before


def test_the_child_ends_when_the_server_is_killed():
    """A server killed with SIGKILL cannot close its sessions: each child notices that its parent is gone and ends
    (no orphan keeps the model in memory)."""
    code = (
        "import os, signal, sys\n"
        "from vanilla_transformer_ort.serve.workers import SessionProcess\n"
        f"session = SessionProcess({str(trained_export_dir())!r})\n"
        "print(session.pid, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    child = int(result.stdout.split()[0])
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child)


def test_a_script_without_a_main_guard_is_told_what_to_do(tmp_path):
    """Spawned processes import the script that started them again: one that starts a session at module level gets
    an error that names the fix, not only multiprocessing's traceback."""
    script = tmp_path / "serve_here.py"
    script.write_text(
        "from vanilla_transformer_ort.serve.workers import SessionProcess\n"
        f"SessionProcess({str(trained_export_dir())!r})\n"
    )
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: ") and "if __name__ == '__main__':" in last and "thread" in last, last


def test_a_child_that_loads_too_slowly_is_refused():
    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError, match=r"could not be started: it took over 0.001 s to load"):
        SessionProcess(trained_export_dir(), start_timeout=0.001)
    assert set(multiprocessing.active_children()) <= before


def test_close_ends_the_child_and_refuses_more_batches():
    session = SessionProcess(trained_export_dir(), intra_op_num_threads=1)
    pid = session.pid
    session.close()
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)
    with pytest.raises(RuntimeError, match="closed"):
        session.generate(np.array([[5, 2]]))


def test_session_workers_setting():
    assert ServeSettings().session_workers == "process"
    assert ServeSettings(session_workers="thread").session_workers == "thread"
    with pytest.raises(ValueError, match="session_workers must be one of process, thread"):
        ServeSettings(session_workers="fork")


def test_session_processes_run_below_the_server(session):
    """Decoding takes the CPU the server leaves: the server's own process answers and refuses without waiting."""
    assert os.getpriority(os.PRIO_PROCESS, session.pid) == os.getpriority(os.PRIO_PROCESS, 0) + SESSION_NICENESS


# -- step-level batching in a child process ---------------------------------------------------------------------------


def _padded(sources):
    ids = np.zeros((len(sources), max(map(len, sources))), np.int64)
    for row, source in enumerate(sources):
        ids[row, : len(source)] = source
    return ids, (ids != 0).astype(np.int64)


def test_a_step_session_process_answers_what_generate_gives(oracle):
    session = StepSessionProcess(trained_export_dir(), "cpu", 1, max_sentences=4, overrides={"num_beams": 2})
    try:
        assert session.pid != os.getpid() and alive(session.pid)
        assert os.getpriority(os.PRIO_PROCESS, session.pid) == os.getpriority(os.PRIO_PROCESS, 0) + SESSION_NICENESS
        cohorts = [[ids] for ids in (e.ids for e in oracle.tokenizer.encode_batch(SENTENCES))]
        cohorts.append([e.ids for e in oracle.tokenizer.encode_batch(SENTENCES)])  # more sources than places
        futures = [session.submit(cohort) for cohort in cohorts]
        for cohort, future in zip(cohorts, futures, strict=True):
            np.testing.assert_array_equal(future.result(timeout=60), oracle.generate(*_padded(cohort), num_beams=2))
        stats = session.take_stats()
        assert stats.steps > 0 and stats.rows >= 2 * stats.steps
    finally:
        session.close()
    assert not alive(session.pid)
    with pytest.raises(RuntimeError, match="closed"):  # not a new child: the server is shutting down
        session.submit(cohorts[0])
    assert not session._process.is_alive()


@pytest.mark.parametrize(
    "session",
    ["SessionProcess({folder!r})", "StepSessionProcess({folder!r}, 'cpu', 1, 2, {{}})"],
    ids=["request", "step"],
)
def test_a_session_left_open_does_not_keep_its_server_from_exiting(session):
    """A session the program forgot to close ends with it, quietly: the step session's child ignores SIGTERM, which
    multiprocessing's exit handler sends to daemonic children before waiting for them (it would wait forever), and a
    process pool collected at the interpreter's teardown makes concurrent.futures print an error of its own."""
    code = (
        "import torch  # noqa: F401  (a program with torch loaded: the teardown order that shows the error)\n"
        "from vanilla_transformer_ort.serve.workers import SessionProcess, StepSessionProcess\n"
        "if __name__ == '__main__':\n"
        f"    session = {session.format(folder=str(trained_export_dir()))}\n"
        "    print(session.pid, flush=True)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, result.stderr[-2000:]
    child = int(result.stdout.split()[0])
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child)


def test_a_killed_step_session_fails_what_it_was_translating_and_is_replaced(oracle):
    session = StepSessionProcess(trained_export_dir(), "cpu", 1, max_sentences=4, overrides={"max_new_tokens": 400})
    try:
        first = session.pid
        sources = [e.ids for e in oracle.tokenizer.encode_batch(SENTENCES)]
        in_flight = session.submit(sources)
        os.kill(first, signal.SIGKILL)
        with pytest.raises(SessionLost, match="process ended"):
            in_flight.result(timeout=30)
        answer = session.submit(sources[:1]).result(timeout=60)
        assert session.pid != first and alive(session.pid)
        np.testing.assert_array_equal(answer, oracle.generate(*_padded(sources[:1]), max_new_tokens=400))
    finally:
        session.close()
