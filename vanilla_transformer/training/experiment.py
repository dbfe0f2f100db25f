"""One training run end to end: tokenizer, corpus, model, the paper's recipe on `TranslationTrainer`, evaluation with
beam search (§6.1), logs and plots. `vt-train` (scripts/train.py) parses the arguments and calls `run_training`.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    PreTrainedModel,
    Seq2SeqTrainingArguments,
    set_seed,
)
from transformers.utils import logging

from ..model.loss import IGNORE_INDEX
from .callbacks import MetricsFileCallback, TimeBudgetCallback, sum_over_ranks
from .data import DataArguments
from .metrics import build_compute_metrics, decode_ids
from .recipe import RecipeArguments, apply_paper_recipe
from .tokenization import check_special_token_ids
from .trainer import TranslationTrainer, resolve_resume_checkpoint

if TYPE_CHECKING:  # datasets is imported where used: `--help` works without the train extra
    from .prepared import PreparedCorpus

logger = logging.get_logger(__name__)


@dataclass
class ModelArguments:
    """Which model to train: a preset (paper Table 3 or a reduced one) with overrides, or a saved checkpoint."""

    preset: str = field(default="small", metadata={"help": "Config preset: base, big (Table 3), small or tiny."})
    config_overrides: str | None = field(
        default=None,
        metadata={"help": "Comma-separated config fields to override, e.g. 'dropout=0.3,encoder_layers=4'."},
    )
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Fine-tune a saved model folder instead of starting from a preset."}
    )
    attn_implementation: str | None = field(
        default=None, metadata={"help": "Attention backend: sdpa (default) or eager."}
    )


def parse_config_overrides(text: str | None) -> dict[str, Any]:
    """'a=1,b=0.1,c=true,d=relu' -> {'a': 1, 'b': 0.1, 'c': True, 'd': 'relu'} (values read as JSON when possible).

    Unknown field names are a `ValueError` that suggests the closest field.
    """
    from ..model.configuration_vanilla_transformer import VanillaTransformerConfig

    overrides: dict[str, Any] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        if "=" not in item or not item.split("=", 1)[0].strip():
            raise ValueError(f"Bad --config_overrides item {item!r}: expected name=value, e.g. 'dropout=0.3'.")
        name, value = (part.strip() for part in item.split("=", 1))
        try:
            overrides[name] = json.loads(value)
        except json.JSONDecodeError:
            overrides[name] = value
    VanillaTransformerConfig.check_field_names(overrides, source="--config_overrides field")
    return overrides


def load_tokenizer(data_args: DataArguments, model_args: ModelArguments):
    """The tokenizer named by --tokenizer_name, else the one saved with --model_name_or_path, else the one of the
    --prepared_data folder."""
    name = data_args.tokenizer_name or model_args.model_name_or_path
    if not name and data_args.prepared_data:
        from .prepared import TOKENIZER_FOLDER, read_manifest

        if read_manifest(data_args.prepared_data) is not None:
            name = str(Path(data_args.prepared_data) / TOKENIZER_FOLDER)
    if not name:
        raise ValueError(
            "no tokenizer: pass --tokenizer_name (train one with vt-train-tokenizer) or --model_name_or_path"
        )
    if not Path(name).exists() and (is_local_path(name) or os.environ.get("HF_HUB_OFFLINE") == "1"):
        flag = "--tokenizer_name" if data_args.tokenizer_name else "--model_name_or_path"
        offline = "" if is_local_path(name) else " (and the Hub is offline)"
        raise ValueError(
            f"tokenizer folder {name} does not exist{offline}; pass {flag} a folder vt-train-tokenizer or vt-train "
            "wrote, or a Hub id"
        )
    return AutoTokenizer.from_pretrained(name)


def is_local_path(name: str) -> bool:
    """Whether `name` can only be a path, never a Hub id (`owner/name`): absolute, relative to `.`, `..` or `~`, or
    with more than one `/`."""
    return name.startswith(("/", ".", "~")) or "\\" in name or name.count("/") > 1


def build_model(model_args: ModelArguments, tokenizer) -> PreTrainedModel:
    """A fresh model from `--preset` (vocabulary and special ids taken from the tokenizer) or a saved checkpoint."""
    import vanilla_transformer  # noqa: F401  (registers the Auto classes)
    from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

    extra = {"attn_implementation": model_args.attn_implementation} if model_args.attn_implementation else {}
    if model_args.model_name_or_path:
        from ..model.configuration_vanilla_transformer import SIZE_FIELDS

        overrides = parse_config_overrides(model_args.config_overrides)
        sizes = sorted(set(overrides) & set(SIZE_FIELDS))
        if sizes:
            raise ValueError(
                f"--config_overrides cannot change {sizes} of the saved model {model_args.model_name_or_path}: its "
                "weights have those sizes. Override only non-size fields (e.g. dropout), or train from --preset."
            )
        model = AutoModelForSeq2SeqLM.from_pretrained(model_args.model_name_or_path, **overrides, **extra)
    else:
        overrides = {
            "vocab_size": len(tokenizer),
            "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "decoder_start_token_id": tokenizer.bos_token_id,
            **parse_config_overrides(model_args.config_overrides),
        }
        config = VanillaTransformerConfig.from_preset(model_args.preset, **overrides, **extra)
        model = VanillaTransformerForConditionalGeneration(config)
    check_special_token_ids(tokenizer, model.config)
    return model


def set_generation_defaults(model: PreTrainedModel, num_beams: int, length_penalty: float, max_length: int) -> None:
    """Beam size, length penalty and length limit saved with the model (generation_config.json), paper §6.1."""
    model.generation_config.num_beams = num_beams
    model.generation_config.max_length = max_length
    if num_beams > 1:  # beam-only settings; transformers refuses to save them with greedy decoding
        model.generation_config.length_penalty = length_penalty
        model.generation_config.early_stopping = True


def build_trainer(
    model: PreTrainedModel,
    tokenizer,
    training_args: Seq2SeqTrainingArguments,
    recipe: RecipeArguments,
    train_dataset=None,
    eval_dataset=None,
    callbacks: list | None = None,
) -> TranslationTrainer:
    """`TranslationTrainer` with the seq2seq collator (-100 label padding, decoder inputs from the model) and BLEU."""
    # Tensor cores want lengths in multiples of 8; on the CPU that padding would only add work.
    mixed_precision_on_gpu = (training_args.fp16 or training_args.bf16) and not training_args.use_cpu
    pad_multiple = 8 if mixed_precision_on_gpu else None
    collator = DataCollatorForSeq2Seq(
        tokenizer, model=model, label_pad_token_id=IGNORE_INDEX, pad_to_multiple_of=pad_multiple
    )  # model= matters: with label smoothing the Trainer removes labels, so decoder_input_ids must be in the batch
    compute_metrics = build_compute_metrics(tokenizer) if training_args.predict_with_generate else None
    return TranslationTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        data_collator=collator,
        compute_metrics=compute_metrics,
        callbacks=[MetricsFileCallback(training_args.output_dir), *(callbacks or [])],
        max_tokens=recipe.max_tokens,
        lr_schedule=recipe.lr_schedule,
        lr_cooldown=recipe.lr_cooldown,
    )


def run_training(
    model_args: ModelArguments,
    data_args: DataArguments,
    training_args: Seq2SeqTrainingArguments,
    recipe: RecipeArguments,
    explicit: set[str] = frozenset(),
    time_budget_s: float | None = None,
    plot: bool = True,
    corpus: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """Train (unless --do_train is off), evaluate on the test split with beam search, save everything.

    `corpus` names the data in training_info.json (and so in the model card) as (name, description) when the
    files' own names would not say what it is. Returns the final metrics (test_bleu, test_chrf, ...) that are also
    written to `<output_dir>/all_results.json`.
    """
    tokenizer = load_tokenizer(data_args, model_args)
    check_run_arguments(training_args, model_args)
    parse_config_overrides(model_args.config_overrides)  # fail on a typo now, not after loading the data
    resume = resolve_resume_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir)
    from .prepared import load_corpus

    prepared = load_corpus(data_args, tokenizer)  # memory-mapped; prepared once for every rank and every restart
    tokenized = prepared.splits
    # Seed before the model is built: its initialisation draws from the global generators (the Trainer seeds again
    # later, which fixes the data order and dropout but would leave the initial weights unseeded).
    set_seed(training_args.seed)
    model = build_model(model_args, tokenizer)
    if not recipe.paper_recipe and "lr_schedule" not in explicit:
        recipe.lr_schedule = "trainer"
    apply_paper_recipe(training_args, recipe, model.config.d_model, explicit)
    num_beams = training_args.generation_num_beams or 1
    # Paper §6.1: outputs may be up to the input length + 50; one ceiling for the batch here.
    training_args.generation_max_length = training_args.generation_max_length or data_args.max_target_length + 50
    set_generation_defaults(
        model, num_beams, recipe.length_penalty if recipe.length_penalty is not None else 1.0,
        training_args.generation_max_length,
    )  # fmt: skip
    callbacks = [TimeBudgetCallback(time_budget_s)] if time_budget_s else []
    trainer = build_trainer(
        model, tokenizer, training_args, recipe, tokenized.get("train"), tokenized.get("validation"), callbacks
    )
    results: dict[str, Any] = {"parameters": sum(p.numel() for p in model.parameters())}
    if training_args.do_train:
        started = time.monotonic()
        train_output = trainer.train(resume_from_checkpoint=resume)
        wall_s = time.monotonic() - started
        tokens = {side: sum_over_ranks(count) for side, count in trainer.tokens_seen.items()}  # all processes
        results.update(
            train_output.metrics, train_wall_s=round(wall_s, 1), train_source_tokens=tokens["source"],
            train_target_tokens=tokens["target"],
            train_tokens_per_second=round((tokens["source"] + tokens["target"]) / max(wall_s, 1e-9), 1),
        )  # fmt: skip
        if recipe.average_checkpoints > 1:
            averaged = average_final_weights(trainer, recipe.average_checkpoints)
            results["averaged_checkpoints"] = averaged
        trainer.save_model()  # model, tokenizer, generation config
    test = tokenized.get("test") or tokenized.get("validation")
    if test is not None and training_args.predict_with_generate:
        if training_args.fp16 or training_args.bf16:
            # Score the weights as saved, in fp32 as vt-evaluate and vt-translate run them. Mixed-precision training
            # puts an autocast wrapper on the model instance as its `forward` attribute; deleting that attribute
            # gives back the class's forward. (accelerate's unwrap_model(keep_fp32_wrapper=False) unwraps further,
            # through transformers' own decorators of forward, and breaks generate().)
            vars(trainer.accelerator.unwrap_model(trainer.model)).pop("forward", None)
        prediction = trainer.predict(test, metric_key_prefix="test")
        results.update(prediction.metrics)
        if trainer.is_world_process_zero():
            hypotheses = decode_ids(prediction.predictions, tokenizer)
            Path(training_args.output_dir).mkdir(parents=True, exist_ok=True)
            (Path(training_args.output_dir) / "test_predictions.txt").write_text("\n".join(hypotheses) + "\n")
    if trainer.is_world_process_zero():
        trainer.save_metrics("all", results, combined=False)
        train_pairs = prepared.stats.get("train", {}).get("read", 0)
        info = training_info(data_args, model_args, training_args, recipe, trainer, train_pairs)
        if corpus is not None:
            info["dataset"], info["dataset description"] = corpus
        (Path(training_args.output_dir) / "training_info.json").write_text(json.dumps(info, indent=2) + "\n")
        if plot:
            _plot_run(trainer, tokenizer, prepared, training_args.output_dir)
    return results


def average_final_weights(trainer: TranslationTrainer, count: int) -> list[str]:
    """§6.1: the trained model's weights become their mean with the newest `count - 1` checkpoints of the run."""
    from .averaging import average_with_checkpoints

    if trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled:
        raise ValueError(
            "--average_checkpoints works on whole (unsharded) models; under FSDP or DeepSpeed, average the saved "
            "checkpoints afterwards with vt-average-checkpoints."
        )
    model = trainer.accelerator.unwrap_model(trainer.model)
    return average_with_checkpoints(model, trainer.args.output_dir, count, trainer.state.global_step)


def check_run_arguments(training_args: Seq2SeqTrainingArguments, model_args: ModelArguments | None = None) -> None:
    """Refuse runs that would do nothing and still exit 0 (no --do_* flag, training for zero steps) or score an
    untrained model (--do_eval/--do_predict without --do_train or --model_name_or_path)."""
    if not (training_args.do_train or training_args.do_eval or training_args.do_predict):
        raise ValueError(
            "Nothing to do: pass --do_train to train (add --predict_with_generate to score the test split after "
            "training), or --do_eval/--do_predict with --model_name_or_path --predict_with_generate to score a saved "
            "model."
        )
    if not training_args.do_train and not training_args.predict_with_generate:
        raise ValueError(
            "Nothing to do: without --do_train, --do_eval/--do_predict only score the test split with "
            "--predict_with_generate; add it (and --model_name_or_path for the model to score)."
        )
    if not training_args.do_train and model_args is not None and not model_args.model_name_or_path:
        raise ValueError(
            "--do_eval/--do_predict without --do_train would score a randomly initialised model: pass "
            "--model_name_or_path with the model to score, or add --do_train."
        )
    if training_args.do_train:
        if training_args.max_steps == 0:
            raise ValueError("--max_steps 0 trains nothing: pass --max_steps N > 0, or drop --do_train to only score.")
        if training_args.max_steps < 0 and training_args.num_train_epochs <= 0:
            raise ValueError(
                f"--num_train_epochs {training_args.num_train_epochs} trains nothing: pass --num_train_epochs > 0 or "
                "--max_steps N > 0, or drop --do_train to only score."
            )


def training_info(data_args, model_args, training_args, recipe, trainer, train_pairs: int) -> dict[str, Any]:
    """What the model card says about the run (`training_info.json` next to the model)."""
    if data_args.dataset_name:
        dataset = data_args.dataset_name + (
            f"/{data_args.dataset_config_name}" if data_args.dataset_config_name else ""
        )
    elif data_args.train_file:
        dataset = Path(data_args.train_file).parent.name or Path(data_args.train_file).name
    else:
        dataset = f"gettext-{data_args.source_lang}-{data_args.target_lang} (system translation catalogs)"
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)  # unwrap accelerate's AcceleratedOptimizer
    return {
        "source_lang": data_args.source_lang,
        "target_lang": data_args.target_lang,
        "dataset": dataset,
        "training pairs": train_pairs,
        "preset": model_args.model_name_or_path or model_args.preset,
        "paper recipe": recipe.paper_recipe,
        "steps": trainer.state.global_step,
        "learning rate schedule": recipe.lr_schedule,
        "peak learning rate": training_args.learning_rate,
        "warmup steps": training_args.warmup_steps,
        "learning rate cooldown (fraction of the steps)": recipe.lr_cooldown or None,
        "optimizer": type(optimizer).__name__ if optimizer is not None else None,
        "adam betas": [training_args.adam_beta1, training_args.adam_beta2],
        "adam epsilon": training_args.adam_epsilon,
        "label smoothing": training_args.label_smoothing_factor,
        "weight decay": training_args.weight_decay,
        "dropout": getattr(trainer.model.config, "dropout", None),
        "attention dropout": getattr(trainer.model.config, "attention_dropout", None),
        "activation dropout": getattr(trainer.model.config, "activation_dropout", None),
        "training processes": training_args.world_size,
        "tokens per batch and process (source and target, each)": recipe.max_tokens,
        "gradient accumulation steps": training_args.gradient_accumulation_steps,
        "evaluation beams": training_args.generation_num_beams,
        "length penalty": recipe.length_penalty,
        "averaged checkpoints": recipe.average_checkpoints if recipe.average_checkpoints > 1 else None,
    }


def _plot_run(trainer: TranslationTrainer, tokenizer, corpus: PreparedCorpus, output_dir: str) -> None:
    """Loss/BLEU curves and one example's cross-attention heatmap, next to the model (main process only)."""
    from .plotting import plot_cross_attention, plot_training_curves

    plot_training_curves(trainer.state.log_history, Path(output_dir) / "training_curves.png")
    source = min(corpus.example_sources(50, tokenizer), key=lambda s: abs(len(s) - 40))  # readable, medium length
    if (Path(output_dir) / "model.safetensors").is_file():
        # Reload the saved model: under FSDP/DeepSpeed the trained one is sharded and only this rank draws.
        model = AutoModelForSeq2SeqLM.from_pretrained(output_dir)
    else:
        model = trainer.accelerator.unwrap_model(trainer.model)
    plot_cross_attention(model, tokenizer, source, Path(output_dir) / "cross_attention.png")
