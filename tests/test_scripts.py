"""Each script's --help, and one tiny end-to-end run: tokenizer → train → evaluate → translate → average."""

import importlib
import importlib.util
import json
from pathlib import Path

import pytest
from huggingface_hub import ModelCard
from transformers import AutoModelForSeq2SeqLM

from tests.training_fixtures import *  # noqa: F403 (pytest fixtures)
from tests.training_fixtures import TINY_OVERRIDES_ARG
from vanilla_transformer_ort.cli_common import UserError

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["train_tokenizer", "train", "evaluate", "translate", "average_checkpoints"]
# The console scripts of pyproject.toml whose targets live in this package's training/inference side.
CONSOLE_SCRIPTS = ["vt-train", "vt-evaluate", "vt-translate", "vt-train-tokenizer", "vt-average-checkpoints",
                   "vt-main-job", "vt-convert-marian", "vt-push-to-hub"]  # fmt: skip


def command(name):
    """The command function of `vt-<name>` (`vt-train` is `train_command`): it returns what it made."""
    from vanilla_transformer import cli
    from vanilla_transformer.hub import cli as hub_cli
    from vanilla_transformer.marian import cli as marian_cli

    return next(getattr(module, f"{name}_command") for module in (cli, marian_cli, hub_cli)
                if hasattr(module, f"{name}_command"))  # fmt: skip


@pytest.mark.parametrize("name", NAMES)
def test_help(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        command(name)(["--help"])
    assert exit_info.value.code == 0
    assert "usage" in capsys.readouterr().out


def console_script(name):
    """The function `[project.scripts]` in pyproject.toml names for `name`."""
    tomllib = pytest.importorskip("tomllib")
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert name in scripts, f"{name} is not in [project.scripts]"
    module, _, attribute = scripts[name].partition(":")
    return getattr(importlib.import_module(module), attribute)


@pytest.mark.parametrize("name", CONSOLE_SCRIPTS)
def test_console_script_help(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        console_script(name)(["--help"])
    assert exit_info.value.code == 0
    assert "usage" in capsys.readouterr().out


def test_console_script_returns_an_exit_status(tmp_path, capsys):
    # The console-script wrapper passes the return value to sys.exit: an int status, never the command's result.
    push = console_script("vt-push-to-hub")
    assert push(["--model", str(tmp_path / "none"), "--repo_id", "u/m", "--dry_run", str(tmp_path / "out")]) == 2
    assert "none: no such folder" in capsys.readouterr().err


def test_end_to_end(tmp_path, toy_data_dir, capsys, monkeypatch):
    files = [f"--{kind}_file={toy_data_dir / name}.tsv" for kind, name in
             (("train", "train"), ("validation", "valid"), ("test", "test"))]  # fmt: skip
    tokenizer_dir = tmp_path / "tokenizer"
    command("train_tokenizer")(["--train_file", str(toy_data_dir / "train.tsv"), "--vocab_size", "400",
                                          "--output_dir", str(tokenizer_dir)])  # fmt: skip
    run = tmp_path / "run"
    results = command("train")([
        *files, "--tokenizer_name", str(tokenizer_dir), "--preset", "tiny", "--config_overrides", TINY_OVERRIDES_ARG,
        "--output_dir", str(run), "--do_train", "--predict_with_generate", "--max_steps", "12", "--save_steps", "6",
        "--warmup_steps", "4", "--learning_rate", "3e-3", "--max_tokens", "256", "--logging_steps", "3",
        "--eval_strategy", "steps", "--eval_steps", "6",
        "--max_eval_samples", "8", "--max_predict_samples", "8", "--report_to", "none",
        "--use_cpu", "--disable_tqdm", "true",
    ])  # fmt: skip
    assert {"test_bleu", "test_chrf", "train_loss"} <= set(results)
    expected = ["model.safetensors", "tokenizer.json", "generation_config.json", "metrics.jsonl", "metrics.csv",
                "all_results.json", "training_curves.png", "cross_attention.png", "test_predictions.txt"]  # fmt: skip
    for name in expected:
        assert (run / name).is_file(), name
    generation = json.loads((run / "generation_config.json").read_text())
    assert generation["num_beams"] == 4 and generation["length_penalty"] == 0.6  # paper §6.1 defaults saved
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert any("eval_bleu" in entry for entry in logged) and any("loss" in entry for entry in logged)
    capsys.readouterr()

    import vanilla_transformer.inference as inference

    decoding = []
    real_translate = inference.translate
    monkeypatch.setattr(inference, "translate", lambda *a, **kw: decoding.append(kw) or real_translate(*a, **kw))
    scores = command("evaluate")(["--model", str(run), "--test_file", str(toy_data_dir / "test.tsv"),
                                            "--max_samples", "5", "--num_beams", "2"])  # fmt: skip
    assert scores["pairs"] == 5 and 0 <= scores["bleu"] <= 100
    assert decoding[-1]["num_beams"] == 2 and decoding[-1]["length_penalty"] is None  # None: the model's own
    command("evaluate")(["--model", str(run), "--test_file", str(toy_data_dir / "test.tsv"),
                                  "--max_samples", "5"])  # fmt: skip
    assert decoding[-1]["num_beams"] is None  # the model's generation config decides (4, saved above)
    (tmp_path / "in.txt").write_text("the red house.\nthe key is missing now.\n")
    translations = command("translate")(["--model", str(run), "--input_file", str(tmp_path / "in.txt"),
                                                  "--output_file", str(tmp_path / "out.txt")])  # fmt: skip
    assert len(translations) == 2 and (tmp_path / "out.txt").read_text().count("\n") == 2
    averaged = command("average_checkpoints")(["--run_dir", str(run), "--num_checkpoints", "2",
                                                        "--output_dir", str(tmp_path / "avg")])  # fmt: skip
    assert AutoModelForSeq2SeqLM.from_pretrained(averaged).config.d_model == 32

    # The run folder is what the Hub upload takes: its card reports the BLEU/chrF this run measured.
    info = json.loads((run / "training_info.json").read_text())
    assert (info["source_lang"], info["target_lang"], info["steps"]) == ("en", "de", 12)
    hub = tmp_path / "hub"
    assert command("push_to_hub")(["--model", str(run), "--repo_id", "someone/toy", "--dry_run", str(hub)]) == 0
    card = ModelCard.load(hub / "README.md")
    measured = json.loads((run / "all_results.json").read_text())
    bleu = next(r for r in card.data.eval_results if r.metric_type == "bleu")
    assert bleu.metric_value == round(measured["test_bleu"], 2) and card.data.language == ["en", "de"]
    # The training section names torch's optimizer (not accelerate's wrapper) and writes a setting left off as "none".
    assert f"- optimizer: {info['optimizer']}" in card.text and info["optimizer"] in {"Adam", "AdamW"}
    assert "- averaged checkpoints: none" in card.text and "None" not in card.text


def test_missing_tokenizer_and_input_are_clear_errors(tmp_path, toy_data_dir, capsys):
    with pytest.raises(ValueError, match="no tokenizer: pass --tokenizer_name"):
        command("train")(["--train_file", str(toy_data_dir / "train.tsv"), "--output_dir", str(tmp_path)])
    with pytest.raises(SystemExit):
        command("translate")(["--model", str(tmp_path), "--input_file", str(tmp_path / "none.txt")])
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(UserError, match=r"--model \S*nope: no such folder; pass the --output_dir of vt-train"):
        command("evaluate")(["--model", str(tmp_path / "nope"), "--test_file", str(toy_data_dir / "test.tsv")])
