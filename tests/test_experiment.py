"""Whole training runs (`run_training`, as scripts/train.py calls it): the same seed gives the same weights bit for
bit, a resumed run ends where an uninterrupted one ends, and faults mid-run leave a loadable last checkpoint."""

import json
import math
import shutil

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM, HfArgumentParser, Seq2SeqTrainingArguments, Trainer

from tests.training_fixtures import *  # noqa: F403 (pytest fixtures)
from tests.training_fixtures import make_pairs
from vanilla_transformer.training.data import DataArguments
from vanilla_transformer.training.experiment import ModelArguments, run_training
from vanilla_transformer.training.recipe import RecipeArguments, explicit_flags
from vanilla_transformer.training.trainer import NonFiniteLossError, TranslationTrainer, last_complete_checkpoint

# Dropout everywhere, so identical runs need identical random streams; one layer each keeps runs at ~1 s.
OVERRIDES = (
    "d_model=32,encoder_layers=1,decoder_layers=1,encoder_ffn_dim=48,decoder_ffn_dim=40,"
    "dropout=0.3,attention_dropout=0.1,activation_dropout=0.1"
)
STEPS, SAVE_STEPS, KILL_AT = 12, 4, 10


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    """40 pairs: four token-budget batches, two updates per epoch, so the run and its resume cross epochs."""
    path = tmp_path_factory.mktemp("runs") / "train.tsv"
    path.write_text("en\tde\n" + "".join(f"{en}\t{de}\n" for en, de in make_pairs(40, seed=1)), encoding="utf-8")
    return path


def run(output_dir, train_file, tokenizer_dir, *extra):
    argv = [
        "--train_file", str(train_file), "--tokenizer_name", str(tokenizer_dir), "--preset", "tiny",
        "--config_overrides", OVERRIDES, "--output_dir", str(output_dir), "--do_train", "--max_steps", str(STEPS),
        "--save_steps", str(SAVE_STEPS), "--max_tokens", "128", "--gradient_accumulation_steps", "2",
        "--warmup_steps", "3", "--learning_rate", "3e-3", "--logging_steps", "1", "--seed", "7",
        "--report_to", "none", "--use_cpu", "--disable_tqdm", "true", *extra,
    ]  # fmt: skip
    parser = HfArgumentParser((ModelArguments, DataArguments, RecipeArguments, Seq2SeqTrainingArguments))
    model_args, data_args, recipe, training_args = parser.parse_args_into_dataclasses(argv)
    return run_training(model_args, data_args, training_args, recipe, explicit_flags(argv), plot=False)


def assert_same_weights(folder, reference):
    weights, expected = load_file(folder / "model.safetensors"), load_file(reference / "model.safetensors")
    assert weights.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(weights[key], value), key


def loss_rows(folder):
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [(row["step"], row["loss"]) for row in rows if "loss" in row]


@pytest.fixture(scope="module")
def straight(tmp_path_factory, train_file, toy_tokenizer_dir):
    """The uninterrupted reference run."""
    folder = tmp_path_factory.mktemp("straight")
    run(folder, train_file, toy_tokenizer_dir)
    return folder


def test_same_seed_gives_bit_identical_weights(tmp_path, straight, train_file, toy_tokenizer_dir):
    run(tmp_path / "again", train_file, toy_tokenizer_dir)
    assert_same_weights(tmp_path / "again", straight)  # initialisation, data order and dropout all repeat
    assert loss_rows(tmp_path / "again") == loss_rows(straight)
    run(tmp_path / "other", train_file, toy_tokenizer_dir, "--seed", "8")
    other = load_file(tmp_path / "other" / "model.safetensors")
    assert not torch.equal(
        other["model.shared.weight"], load_file(straight / "model.safetensors")["model.shared.weight"]
    )


def _kill_at(monkeypatch, step, error=KeyboardInterrupt):
    """Make the Trainer die when it starts update `step`, as a killed process would (the checkpoints stay)."""
    original = TranslationTrainer.training_step

    def training_step(self, *args, **kwargs):
        if self.state.global_step + 1 == step:
            raise error(f"killed at update {step}")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(TranslationTrainer, "training_step", training_step)


def test_resume_after_a_kill_is_bit_identical_and_logs_each_step_once(
    tmp_path, monkeypatch, straight, train_file, toy_tokenizer_dir
):
    with monkeypatch.context() as patch:
        _kill_at(patch, KILL_AT)
        with pytest.raises(KeyboardInterrupt):
            run(tmp_path, train_file, toy_tokenizer_dir)
    assert [step for step, _ in loss_rows(tmp_path)] == list(range(1, KILL_AT))  # 8 is saved, 9 only logged
    run(tmp_path, train_file, toy_tokenizer_dir, "--resume_from_checkpoint", "True")
    assert_same_weights(tmp_path, straight)
    assert loss_rows(tmp_path) == loss_rows(straight)  # one row per step, the same losses
    csv_steps = [line.split(",")[0] for line in (tmp_path / "metrics.csv").read_text().splitlines()[1:]]
    assert csv_steps == sorted(csv_steps, key=int) and csv_steps.count("9") == csv_steps.count("1")


def test_failed_checkpoint_write_leaves_the_previous_one_and_resume_skips_it(
    tmp_path, monkeypatch, straight, train_file, toy_tokenizer_dir
):
    """transformers writes a checkpoint in place (no temporary folder): a failure mid-save leaves a partial
    checkpoint-8. Resuming from the run folder takes the last complete one (trainer_state.json is written last)."""
    original = Trainer._save_optimizer_and_scheduler

    def save_optimizer_and_scheduler(self, output_dir):
        if output_dir.endswith(f"checkpoint-{2 * SAVE_STEPS}"):
            raise OSError(28, "No space left on device")
        return original(self, output_dir)

    with monkeypatch.context() as patch:
        patch.setattr(Trainer, "_save_optimizer_and_scheduler", save_optimizer_and_scheduler)
        with pytest.raises(OSError, match="No space left"):
            run(tmp_path, train_file, toy_tokenizer_dir)
    partial = tmp_path / f"checkpoint-{2 * SAVE_STEPS}"
    assert (partial / "model.safetensors").is_file() and not (partial / "trainer_state.json").exists()
    assert last_complete_checkpoint(tmp_path) == tmp_path / f"checkpoint-{SAVE_STEPS}"
    AutoModelForSeq2SeqLM.from_pretrained(tmp_path / f"checkpoint-{SAVE_STEPS}")  # the previous one still loads
    with pytest.raises(ValueError, match="incomplete"):
        run(tmp_path, train_file, toy_tokenizer_dir, "--resume_from_checkpoint", str(partial))
    run(tmp_path, train_file, toy_tokenizer_dir, "--resume_from_checkpoint", str(tmp_path))
    assert_same_weights(tmp_path, straight)
    assert loss_rows(tmp_path) == loss_rows(straight)


def test_non_finite_loss_stops_before_the_update_and_names_the_step(
    tmp_path, monkeypatch, train_file, toy_tokenizer_dir
):
    original = TranslationTrainer.compute_loss

    def compute_loss(self, *args, **kwargs):
        loss = original(self, *args, **kwargs)
        return loss * math.nan if self.state.global_step + 1 == 6 else loss

    monkeypatch.setattr(TranslationTrainer, "compute_loss", compute_loss)
    with pytest.raises(NonFiniteLossError, match="nan at step 6"):
        run(tmp_path, train_file, toy_tokenizer_dir)
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == [f"checkpoint-{SAVE_STEPS}"]
    weights = load_file(tmp_path / f"checkpoint-{SAVE_STEPS}" / "model.safetensors")
    assert all(torch.isfinite(value).all() for value in weights.values())
    assert not (tmp_path / "model.safetensors").exists()  # no final model saved from a broken run
    shutil.rmtree(tmp_path)


def test_bf16_training_runs_in_autocast_and_scores_the_test_split_in_fp32(tmp_path, train_file, toy_tokenizer_dir):
    """Mixed precision is for the updates; the reported test score is that of the saved fp32 weights, as vt-evaluate
    and vt-translate compute it."""
    seen = []

    def record(module, args):
        if type(module).__name__ == "VanillaTransformerDecoder":
            seen.append((module.training, torch.is_autocast_enabled("cpu")))

    handle = torch.nn.modules.module.register_module_forward_pre_hook(record)
    try:
        results = run(tmp_path / "bf16", train_file, toy_tokenizer_dir, "--bf16", "--predict_with_generate",
                      "--test_file", str(train_file), "--max_steps", "4", "--generation_max_length", "8")  # fmt: skip
    finally:
        handle.remove()
    training, scoring = [autocast for train, autocast in seen if train], [a for train, a in seen if not train]
    assert training and all(training)  # every training forward ran under bf16 autocast
    assert scoring and not any(scoring)  # and no decoding step of the final test did
    assert 0 <= results["test_bleu"] <= 100
