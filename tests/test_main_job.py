"""The main job end to end on a tiny compiled catalog: corpus, tokenizer, model, BLEU/chrF, examples, summary."""

import json

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from tests.training_fixtures import TINY_OVERRIDES, TINY_OVERRIDES_ARG, make_pairs, write_mo
from vanilla_transformer.training.experiment import parse_config_overrides
from vanilla_transformer.training.main_job import (
    MainJobArguments,
    checkpoint_steps,
    model_overrides,
    run_main_job,
)
from vanilla_transformer.training.recipe import cpu_has_fast_bf16

SIZES = ",".join(f"{name}={value}" for name, value in TINY_OVERRIDES.items() if name != "dropout")  # --dropout decides


# The first case keeps the main job's defaults (bf16 where native, a 20% cooldown, the final weights unaveraged);
# the second turns each of them the other way.
@pytest.mark.parametrize(
    "options",
    [
        {},
        {
            "bf16": False,
            "lr_cooldown": 0.0,
            "weight_decay": 0.0,
            "average_checkpoints": 3,
            "dropout": 0.05,
            "attention_dropout": 0.1,
            "activation_dropout": 0.02,
            "add_prefix_space": False,
        },
    ],
    ids=["defaults", "overridden"],
)
def test_main_job_on_a_tiny_catalog(tmp_path, options):
    pairs = make_pairs(300, seed=1)
    write_mo(tmp_path / "locale" / "de" / "LC_MESSAGES" / "toy.mo", dict(pairs))
    args = MainJobArguments(
        output_dir=str(tmp_path / "job"), locale_dir=str(tmp_path / "locale"), min_pairs=100, vocab_size=400,
        preset="tiny", config_overrides=SIZES, max_tokens=256, max_steps=4, eval_steps=3, save_steps=2,
        max_length=24, max_eval_samples=4, time_budget_minutes=10, reserve_minutes=1,
        examples=["the red house.", "the key."], export_onnx=False, **options,
    )  # fmt: skip
    bf16 = options.get("bf16")
    summary = run_main_job(args)
    assert summary["steps"] == 4 and summary["train_pairs"] + summary["test_pairs"] <= 300
    assert 0 <= summary["test_bleu"] <= 100 and 0 <= summary["test_chrf"] <= 100
    assert set(summary["examples"]) == {"the red house.", "the key."}
    assert set(summary["timings_s"]) == {"harvest", "tokenizer", "train_and_evaluate", "examples", "total"}
    assert summary["preset"] == "tiny" and summary["parameters"] > 0
    # bf16 autocast by default where the CPU multiplies bf16 natively (training.md, "Mixed precision"); --bf16 false
    # keeps fp32.
    assert summary["precision"] == ("bf16 autocast" if bf16 is None and cpu_has_fast_bf16() else "fp32")
    seen = summary["train_tokens_seen"]
    assert seen["source"] > 0 and seen["target"] > 0 and summary["train_tokens_per_second"] > 0
    job = tmp_path / "job"
    model = AutoModelForSeq2SeqLM.from_pretrained(job / "model")
    last = AutoModelForSeq2SeqLM.from_pretrained(job / "model" / "checkpoint-4")
    weights, last_weights = model.state_dict(), last.state_dict()
    same_as_last = all(torch.equal(weights[name], last_weights[name]) for name in weights)
    info = json.loads((job / "model" / "training_info.json").read_text())
    assert info["dataset"] == "gettext-en-de" and "gettext catalogs" in info["dataset description"]
    if not options:
        # By default the learning rate cools down to 0 over the last 20% of the steps and the final weights are
        # kept as they are (training.md, "Out of domain").
        assert summary["lr_cooldown"] == 0.2 and info["learning rate cooldown (fraction of the steps)"] == 0.2
        assert summary["averaged_checkpoints"] is None and same_as_last
        # AdamW's decoupled weight decay 0.1, not in the paper, raised every seed out of domain (training.md); it
        # wins over the paper recipe's 0.0, and the optimizer applies it to the weights but not to biases or norms.
        assert summary["weight_decay"] == info["weight decay"] == 0.1
        groups = _optimizer_groups(job / "model" / "checkpoint-4")
        assert {group["weight_decay"] for group in groups} == {0.1, 0.0}
        assert summary["training_processes"] == 1  # two measured no better on 2 cores (training.md)
        assert model.config.dropout == summary["dropout"] == info["dropout"] == 0.1  # the paper's P_drop (§5.4)
        # No attention dropout, as in the paper (measured no better out of domain); dropout 0.3 after the ReLU, not in
        # the paper, which raised every seed out of domain at equal steps, above 0.2 and 0 (training.md).
        assert model.config.attention_dropout == summary["attention_dropout"] == info["attention dropout"] == 0.0
        assert model.config.activation_dropout == summary["activation_dropout"] == info["activation dropout"] == 0.3
    else:
        # Checkpoints every 2 steps (2 and 4): the final weights are averaged with checkpoint-2 (§6.1).
        assert summary["lr_cooldown"] == 0.0 and info["learning rate cooldown (fraction of the steps)"] is None
        assert summary["weight_decay"] == info["weight decay"] == 0.0
        assert summary["averaged_checkpoints"] == ["checkpoint-2", "step 4"] and not same_as_last
        assert model.config.dropout == summary["dropout"] == 0.05
        assert model.config.attention_dropout == info["attention dropout"] == 0.1
        assert model.config.activation_dropout == info["activation dropout"] == 0.02
    # The tokenizer encodes each text as if it began with a space by default (training.md, "Prefix space"): the first
    # word then takes the tokens it has inside a sentence; --add_prefix_space false trains the plain byte-level one.
    tokenizer = AutoTokenizer.from_pretrained(job / "tokenizer")
    first, inner = tokenizer("house")["input_ids"][:-1], tokenizer("the house")["input_ids"][1:-1]
    assert (first == inner) == options.get("add_prefix_space", True)
    assert tokenizer.decode(tokenizer("the red house.")["input_ids"], skip_special_tokens=True) == "the red house."
    assert json.loads((job / "summary.json").read_text())["test_bleu"] == summary["test_bleu"]
    assert (job / "data" / "train.tsv").read_text().startswith("en\tde\n")
    assert (job / "model" / "cross_attention.png").is_file() and (job / "model" / "training_curves.png").is_file()
    assert list((job / "model" / "runs").glob("*/events.out.tfevents.*"))  # TensorBoard logs
    assert model.config.d_model == 32
    # The main job decodes with length penalty 1.0 (training.md), and the saved model keeps it for generate().
    assert model.generation_config.length_penalty == 1.0 and model.generation_config.num_beams == 4


def test_main_job_in_two_processes_takes_the_batches_of_one(tmp_path):
    """Two DDP processes with half of --max_tokens each take between them, step for step, the batches that one process
    with that half takes one after another: 4 steps of two processes see exactly the tokens of 8 steps of one."""
    write_mo(tmp_path / "locale" / "de" / "LC_MESSAGES" / "toy.mo", dict(make_pairs(300, seed=1)))
    common = dict(
        locale_dir=str(tmp_path / "locale"), min_pairs=100, vocab_size=400, preset="tiny", config_overrides=SIZES,
        eval_steps=100, save_steps=100, max_length=24, max_eval_samples=4, time_budget_minutes=10, reserve_minutes=1,
        examples=["the key."], export_onnx=False,
    )  # fmt: skip
    two = run_main_job(
        MainJobArguments(output_dir=str(tmp_path / "two"), num_processes=2, max_tokens=256, max_steps=4, **common)
    )
    one = run_main_job(
        MainJobArguments(output_dir=str(tmp_path / "one"), num_processes=1, max_tokens=128, max_steps=8, **common)
    )
    assert (two["training_processes"], two["steps"]) == (2, 4) and (one["training_processes"], one["steps"]) == (1, 8)
    assert two["train_tokens_seen"] == one["train_tokens_seen"]  # summed over both processes
    assert two["train_tokens_seen"]["source"] > 0 and two["test_pairs"] == one["test_pairs"]
    assert 0 <= two["test_bleu"] <= 100 and set(two["examples"]) == {"the key."}
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "two" / "model")
    assert model.config.d_model == 32 and (tmp_path / "two" / "model" / "checkpoint-4").is_dir()
    info = json.loads((tmp_path / "two" / "model" / "training_info.json").read_text())  # and so the model card
    assert info["training processes"] == 2 and info["tokens per batch and process (source and target, each)"] == 128


def test_main_job_refuses_a_batch_split_too_small(tmp_path):
    with pytest.raises(ValueError, match="leaves 20 tokens per batch, fewer than --max_length 24"):
        run_main_job(MainJobArguments(output_dir=str(tmp_path), num_processes=2, max_tokens=40, max_length=24))
    with pytest.raises(ValueError, match="--num_processes 0: give 1 or more"):
        run_main_job(MainJobArguments(output_dir=str(tmp_path), num_processes=0))


def test_model_overrides_put_the_dropouts_first_so_config_overrides_win():
    dropouts = {"dropout": 0.2, "attention_dropout": 0.1, "activation_dropout": 0.05}
    assert parse_config_overrides(model_overrides(None, **dropouts)) == dropouts
    assert parse_config_overrides(model_overrides("encoder_layers=4", **dropouts)) == {
        **dropouts,
        "encoder_layers": 4,
    }
    overridden = parse_config_overrides(model_overrides("dropout=0.3,attention_dropout=0", **dropouts))
    assert overridden["dropout"] == 0.3 and overridden["attention_dropout"] == 0


def test_checkpoints_and_validations_are_spaced_to_spare_the_budget():
    # Validation (beam search) every 1,000 steps and a checkpoint every 500: each takes time from training
    # (training.md). Averaging wants the last states close together, so it saves every 100 steps unless told.
    defaults = MainJobArguments()
    assert defaults.eval_steps == 1000 and defaults.save_steps is None and defaults.average_checkpoints == 0
    assert checkpoint_steps(defaults.save_steps, defaults.average_checkpoints) == 500
    assert checkpoint_steps(None, 5) == 100
    assert checkpoint_steps(250, 5) == checkpoint_steps(250, 0) == 250
    with pytest.raises(ValueError, match="--save_steps 0"):
        checkpoint_steps(0, 0)


def test_main_job_without_catalogs_says_what_to_do(tmp_path):
    with pytest.raises(ValueError, match="No gettext catalogs for language 'xx'"):
        run_main_job(MainJobArguments(output_dir=str(tmp_path), locale_dir=str(tmp_path), target_lang="xx"))
    with pytest.raises(ValueError, match="leaves no time to train"):
        write_mo(tmp_path / "de" / "LC_MESSAGES" / "toy.mo", dict(make_pairs(120)))
        run_main_job(MainJobArguments(output_dir=str(tmp_path / "j"), locale_dir=str(tmp_path), min_pairs=100,
                                      vocab_size=300, time_budget_minutes=0.1))  # fmt: skip


@pytest.mark.slow
def test_main_job_exports_and_translates_with_onnxruntime(tmp_path):
    pytest.importorskip("onnxruntime")
    write_mo(tmp_path / "locale" / "de" / "LC_MESSAGES" / "toy.mo", dict(make_pairs(300, seed=1)))
    args = MainJobArguments(
        output_dir=str(tmp_path / "job"), locale_dir=str(tmp_path / "locale"), min_pairs=100, vocab_size=400,
        preset="tiny", config_overrides=TINY_OVERRIDES_ARG, max_tokens=256, max_steps=2, eval_steps=2, max_length=24,
        max_eval_samples=2, reserve_minutes=1, examples=["the red house.", "the key."],
    )  # fmt: skip
    summary = run_main_job(args)
    assert (tmp_path / "job" / "onnx" / "encoder_model.onnx").is_file()
    assert summary["onnx_examples"] == summary["examples"]  # onnxruntime gives the same beam-search translations
    from vanilla_transformer_ort.serve.models import parse_model_spec

    command = summary["serve_command"].split()
    assert command[0] == "vt-serve" and parse_model_spec(command[1]).pair == "en-de"  # the printed command serves it
    from vanilla_transformer.export.cli import export_onnx_command

    command = summary["standard_layout_command"].split()
    assert command[0] == "vt-export-onnx"
    standard = export_onnx_command(command[1:])  # the printed command writes the standard layout
    assert (standard / "onnx" / "decoder_model_merged_quantized.onnx").is_file()


def _optimizer_groups(checkpoint) -> list[dict]:
    """The optimizer's parameter groups as the Trainer saved them with a checkpoint."""
    return torch.load(checkpoint / "optimizer.pt", weights_only=True)["param_groups"]
