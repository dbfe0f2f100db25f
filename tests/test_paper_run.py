"""scripts/paper_run.sh, the paper's WMT14 run, end to end at toy sizes on two CPU processes (its DRY_RUN mode): a
tokenizer, the corpus prepared once from a dataset in the Hub's layout, `accelerate launch`, checkpoint averaging and
sacreBLEU on the test split; a second call resumes instead of starting over."""

import json
import os
import subprocess
import sys
from pathlib import Path

from datasets import Dataset
from transformers import AutoModelForSeq2SeqLM

from tests.training_fixtures import make_pairs

ROOT = Path(__file__).resolve().parents[1]


def _hub_layout_dataset(folder: Path) -> Path:
    """A dataset as the Hub stores wmt14's de-en: parquet files under data/ with a `translation` column."""
    pairs = make_pairs(460, seed=11)
    splits = {"train": pairs[:400], "validation": pairs[400:430], "test": pairs[430:]}
    (folder / "data").mkdir(parents=True)
    for split, rows in splits.items():
        translation = [{"de": de, "en": en} for en, de in rows]
        Dataset.from_dict({"translation": translation}).to_parquet(
            str(folder / "data" / f"{split}-00000-of-00001.parquet")
        )
    return folder


def test_the_paper_run_script_runs_every_step_at_toy_sizes(tmp_path):
    dataset = _hub_layout_dataset(tmp_path / "wmt14-like")
    out = tmp_path / "run"
    env = {
        **os.environ, "DRY_RUN": "1", "DATASET": str(dataset), "DATASET_CONFIG": "", "OUT": str(out),
        "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }  # fmt: skip
    script = ["bash", str(ROOT / "scripts" / "paper_run.sh")]
    completed = subprocess.run(script, env=env, capture_output=True, text=True, timeout=900)
    assert completed.returncode == 0, completed.stderr[-4000:]
    manifest = json.loads((out / "prepared" / "prepared.json").read_text())
    assert manifest["splits"]["train"]["read"] == 400 and manifest["splits"]["test"]["read"] == 30
    results = json.loads((out / "model" / "all_results.json").read_text())
    assert "test_bleu" in results and results["averaged_checkpoints"]  # scored after averaging checkpoints
    info = json.loads((out / "model" / "training_info.json").read_text())
    assert info["training processes"] == 2 and info["steps"] == 4 and info["evaluation beams"] == 4
    assert info["length penalty"] == 0.6 and info["tokens per batch and process (source and target, each)"] == 256
    assert AutoModelForSeq2SeqLM.from_pretrained(out / "model").config.d_model > 0

    again = subprocess.run(script, env={**env, "STEPS": "6"}, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "Reusing the corpus prepared" in again.stderr  # prepared once
    assert json.loads((out / "model" / "training_info.json").read_text())["steps"] == 6  # resumed, 2 more steps
