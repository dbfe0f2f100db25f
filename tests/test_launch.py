"""Local multi-process launches: every rank runs, joins one gloo group, gets its threads; a failure surfaces."""

import os

import pytest
import torch
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from vanilla_transformer.training.launch import run_in_processes, usable_cores


def _report(offset: int) -> dict:
    """Each rank: its place in the group, its threads, and an all-reduce over the group (the sum of rank + offset)."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        total = torch.tensor(dist.get_rank() + offset)
        dist.all_reduce(total)
        return {
            "rank": dist.get_rank(),
            "world": dist.get_world_size(),
            "threads": torch.get_num_threads(),
            "sum": int(total),
            "omp": os.environ.get("OMP_NUM_THREADS"),
        }
    finally:
        dist.destroy_process_group()


def _fail_on_rank_one() -> None:
    if os.environ["RANK"] == "1":
        raise RuntimeError("rank one gives up")


def test_every_rank_runs_in_one_group_with_its_threads():
    before = os.environ.get("OMP_NUM_THREADS")
    reports = run_in_processes(_report, (10,), num_processes=2, threads=1)
    assert [r["rank"] for r in reports] == [0, 1]  # returned by rank
    assert all(r["world"] == 2 and r["threads"] == 1 and r["omp"] == "1" for r in reports)
    assert all(r["sum"] == 10 + 11 for r in reports)  # the processes reached each other
    assert os.environ.get("OMP_NUM_THREADS") == before  # the caller's environment is put back


def test_one_process_runs_in_the_caller():
    assert run_in_processes(os.getpid, (), num_processes=1, threads=1) == [os.getpid()]


def test_a_failing_rank_fails_the_launch_with_its_error():
    with pytest.raises(ChildFailedError, match="rank one gives up"):
        run_in_processes(_fail_on_rank_one, (), num_processes=2, threads=1)


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="must be >= 1"):
        run_in_processes(os.getpid, (), num_processes=0, threads=1)
    with pytest.raises(ValueError, match="must be >= 1"):
        run_in_processes(os.getpid, (), num_processes=2, threads=0)


def test_usable_cores_counts_what_this_process_may_use():
    assert 1 <= usable_cores() <= (os.cpu_count() or 1)
