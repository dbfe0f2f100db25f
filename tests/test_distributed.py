"""Two CPU processes under `accelerate launch` run scripts/train.py: distinct batches per rank, a loadable model."""

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoModelForSeq2SeqLM

from tests.training_fixtures import *  # noqa: F403 (pytest fixtures)
from tests.training_fixtures import TINY_OVERRIDES_ARG

ROOT = Path(__file__).resolve().parents[1]


def test_two_process_launch(tmp_path, toy_data_dir, toy_tokenizer_dir):
    accelerate = Path(sys.executable).with_name("accelerate")
    run, records = tmp_path / "run", tmp_path / "records"
    command = [
        str(accelerate), "launch", "--config_file", str(ROOT / "configs/accelerate/cpu_2proc.yaml"),
        str(ROOT / "tests/ddp_worker.py"), str(records),
        "--train_file", str(toy_data_dir / "train.tsv"), "--test_file", str(toy_data_dir / "test.tsv"),
        "--tokenizer_name", str(toy_tokenizer_dir), "--preset", "tiny", "--config_overrides", TINY_OVERRIDES_ARG,
        "--output_dir", str(run), "--do_train", "--max_steps", "6", "--save_steps", "6", "--warmup_steps", "2",
        "--learning_rate", "3e-3", "--max_tokens", "256", "--logging_steps", "2", "--report_to", "none",
        "--use_cpu", "--disable_tqdm", "true", "--predict_with_generate",
        "--max_eval_samples", "8", "--max_predict_samples", "8",
        "--generation_num_beams", "1", "--prepared_data", str(tmp_path / "prepared"), "--ddp_timeout", "4",
    ]  # fmt: skip
    # Preparing outlasts the distributed timeout: the other rank waits on the file system, not in a collective.
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT),
        "VT_TEST_PREPARE_DELAY": "8",
    }
    completed = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-4000:]
    # One rank prepared the corpus, the other memory-mapped its folder (each rank logs its own warnings).
    assert completed.stderr.count("Prepared train") == 1, completed.stderr[-4000:]
    assert (tmp_path / "prepared" / "prepared.json").is_file()

    ranks = [json.loads((records / f"batches-rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["num_replicas"] == 2 for r in ranks)
    assert all(len(r["batches"]) >= 6 for r in ranks)  # each rank made its 6 steps from its own batches
    steps = [r["batches"][:6] for r in ranks]
    assert all(steps[0][i] != steps[1][i] for i in range(6))  # every step: the two ranks saw different batches
    overlap = {i for b in steps[0] for i in b} & {i for b in steps[1] for i in b}
    assert not overlap, overlap
    model = AutoModelForSeq2SeqLM.from_pretrained(run)
    assert model.config.decoder_layers == 3
    results = json.loads((run / "all_results.json").read_text())
    assert results["train_loss"] > 0 and "test_bleu" in results


def _agree(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from vanilla_transformer.training.callbacks import _min_on_all_ranks, _on_any_rank

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        agreed = {"min": _min_on_all_ranks(100 + 7 * rank), "any": _on_any_rank(rank == 1)}
        Path(out, f"rank{rank}.json").write_text(json.dumps(agreed))
    finally:
        dist.destroy_process_group()


def test_time_budget_decisions_agree_across_ranks(tmp_path):
    """The time budget's stop and the cooldown's end come from each rank's clock; every rank must act on the same
    values (the earliest end, a stop if any rank says so), or DDP ranks would train different schedules or hang."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.start_processes(_agree, args=(port, str(tmp_path)), nprocs=2, start_method="spawn")
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert results == [{"min": 100, "any": True}] * 2


# ---------------------------------------------------------------- distributed runs that equal one process

NO_DROPOUT = TINY_OVERRIDES_ARG + ",attention_dropout=0.0,activation_dropout=0.0"


def _run(command: list[str], log: Path, **env_extra) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **env_extra}
    completed = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    log.write_text(completed.stdout + completed.stderr)
    return completed


def _launch(config: str, script: list[str], processes: int = 2) -> list[str]:
    accelerate = Path(sys.executable).with_name("accelerate")
    return [str(accelerate), "launch", "--config_file", str(ROOT / "configs/accelerate" / config),
            "--num_processes", str(processes), *script]  # fmt: skip


def _train_args(data: Path, tokenizer: Path, prepared: Path, output: Path, steps: int, *extra: str) -> list[str]:
    return [
        "--train_file", str(data / "train.tsv"), "--tokenizer_name", str(tokenizer), "--prepared_data", str(prepared),
        "--preset", "tiny", "--config_overrides", NO_DROPOUT, "--output_dir", str(output), "--do_train",
        "--max_steps", str(steps), "--warmup_steps", "2", "--learning_rate", "3e-3", "--max_tokens", "128",
        "--logging_steps", "1", "--report_to", "none", "--use_cpu", "--disable_tqdm", "true", "--seed", "3", *extra,
    ]  # fmt: skip


def _losses(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows if "loss" in row]


def _weights(run: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run / "model.safetensors"))


def test_two_ranks_equal_one_process_accumulating_two_batches(tmp_path, toy_data_dir, toy_tokenizer_dir):
    """DDP over 2 CPU processes (gloo), per-rank budget B, against 1 process with 2 accumulation steps of budget B:
    the same batches (rank r takes global batch 2k + r; the single process takes 2k and 2k + 1), so losses and weights
    agree within fp32 tolerance; FSDP with the shipped config (full precision) too. The corpus is prepared once, by
    the first run, and memory-mapped by every rank of the others."""
    import torch

    prepared = tmp_path / "prepared"
    single, ddp, fsdp = tmp_path / "single", tmp_path / "ddp", tmp_path / "fsdp"
    train = str(ROOT / "scripts" / "train.py")
    args = functools.partial(_train_args, toy_data_dir, toy_tokenizer_dir, prepared)
    first = _run([sys.executable, train, *args(single, 4, "--gradient_accumulation_steps", "2")], tmp_path / "1.log")
    assert first.returncode == 0, first.stderr[-3000:]
    second = _run(_launch("cpu_2proc.yaml", [train, *args(ddp, 4)]), tmp_path / "2.log")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "Reusing the corpus prepared" in second.stderr and "Prepared train" not in second.stderr
    third = _run(
        _launch("fsdp.yaml", ["--mixed_precision", "no", train, *args(fsdp, 4, "--save_strategy", "no")]),
        tmp_path / "3.log",
    )
    assert third.returncode == 0, third.stderr[-3000:]

    reference = _losses(single)
    assert len(reference) == 4 and reference[0] > reference[-1]
    for run in (ddp, fsdp):
        assert _losses(run) == pytest.approx(reference, rel=1e-4), run.name
        weights, expected = _weights(run), _weights(single)
        assert weights.keys() == expected.keys()
        for name, tensor in expected.items():
            torch.testing.assert_close(weights[name], tensor, rtol=1e-4, atol=1e-5, msg=f"{run.name}: {name}")
    # The FSDP run's saved (gathered) folder loads unsharded and generates as the single process's model does.
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(toy_tokenizer_dir)
    batch = tokenizer(["the red house.", "the key is missing."], return_tensors="pt", padding=True)
    outputs = [
        AutoModelForSeq2SeqLM.from_pretrained(run).eval().generate(**batch, num_beams=2, max_new_tokens=8)
        for run in (single, fsdp)
    ]
    assert torch.equal(outputs[0], outputs[1])


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_resume_after_kill_9_continues_with_the_next_batch(tmp_path, toy_data_dir, toy_tokenizer_dir, ranks):
    """Train 6 steps straight; then again, killed with SIGKILL as step 4 begins, and resumed from checkpoint-3:
    steps 4-6 train on the same batches as the straight run (none replayed, none skipped), the corpus is not
    tokenized again, and the final weights are the straight run's."""
    import torch

    prepared = tmp_path / "prepared"
    worker = [str(ROOT / "tests" / "resume_worker.py")]

    def command(records: Path, output: Path, *extra: str) -> list[str]:
        script = [*worker, str(records), *_train_args(toy_data_dir, toy_tokenizer_dir, prepared, output, 6,
                                                       "--save_steps", "3", *extra)]  # fmt: skip
        return _launch("cpu_2proc.yaml", script, ranks) if ranks > 1 else [sys.executable, *script]

    straight = _run(command(tmp_path / "straight", tmp_path / "straight-run"), tmp_path / "straight.log")
    assert straight.returncode == 0, straight.stderr[-3000:]
    killed = _run(command(tmp_path / "killed", tmp_path / "run"), tmp_path / "killed.log", VT_TEST_KILL_AT_STEP="3")
    assert killed.returncode != 0 and (tmp_path / "run" / "checkpoint-3" / "trainer_state.json").is_file()
    assert not (tmp_path / "run" / "checkpoint-6").exists()
    resumed = _run(
        command(tmp_path / "resumed", tmp_path / "run", "--resume_from_checkpoint", "True"), tmp_path / "resumed.log"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Prepared train" not in resumed.stderr and "Reusing the corpus prepared" in resumed.stderr

    for rank in range(ranks):
        expected = [json.loads(line) for line in (tmp_path / f"straight-rank{rank}.jsonl").read_text().splitlines()]
        after = [json.loads(line) for line in (tmp_path / f"resumed-rank{rank}.jsonl").read_text().splitlines()]
        assert [row["step"] for row in after] == [4, 5, 6]  # nothing replayed
        assert after == expected[3:], rank  # the straight run's batches of steps 4-6
    weights, reference = _weights(tmp_path / "run"), _weights(tmp_path / "straight-run")
    for name, tensor in reference.items():
        torch.testing.assert_close(weights[name], tensor, rtol=1e-5, atol=1e-6, msg=name)
