"""Two CPU processes under `accelerate launch` run scripts/train.py: distinct batches per rank, a loadable model."""

import json
import os
import subprocess
import sys
from pathlib import Path

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
        "--generation_num_beams", "1",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    completed = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-4000:]

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
