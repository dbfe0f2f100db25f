"""The main job: from nothing to a working English→German translator on a CPU within a bounded time.

Harvest the gettext corpus installed on the machine, train the joint BPE tokenizer (§5.1), train a small Transformer
with the paper's recipe (§5) until the time budget is spent, report sacreBLEU and chrF on the held-out split with beam
search (§6.1), save the model and translate a few example sentences; with the `onnx` extra installed, also export
the model to ONNX and translate the examples with onnxruntime.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import Seq2SeqTrainingArguments
from transformers.utils import logging

from vanilla_transformer_ort.cli_common import debug_requested

from ..inference import load_translation_model, translate
from ..progress import show_package_progress, weight_progress_bars
from .data import DataArguments, write_tsv
from .experiment import ModelArguments, run_training
from .gettext_corpus import DEFAULT_LOCALE_DIR, gettext_corpus
from .launch import rank, run_in_processes, usable_cores
from .recipe import RecipeArguments, cpu_has_fast_bf16
from .tokenization import train_bpe_tokenizer

logger = logging.get_logger(__name__)

EXAMPLE_SENTENCES = [
    "File not found.",
    "Permission denied",
    "Do you want to continue?",
    "Cannot open file %s for writing",
    "The connection was closed by the remote host.",
]


def _arg(default, help_text: str):
    return field(default=default, metadata={"help": help_text})


@dataclass
class MainJobArguments:
    output_dir: str = _arg("outputs/main_job", "Where the corpus, tokenizer, model, logs and summary.json go.")
    target_lang: str = _arg("de", "Target language of the gettext corpus (source is English).")
    locale_dir: str = _arg(DEFAULT_LOCALE_DIR, "Root of the installed gettext catalogs.")
    time_budget_minutes: float = _arg(20.0, "Wall-clock budget of the whole job, evaluation included.")
    reserve_minutes: float | None = _arg(None, "Kept back for the final test (default: max of 1 min, 5 percent).")
    vocab_size: int = _arg(8000, "Joint BPE vocabulary size (the paper: ~37k on WMT; this corpus is small).")
    add_prefix_space: bool = _arg(
        True,
        "Tokenize each text as if it began with a space, so first words share the tokens of inner words; measured "
        "better in and out of domain (docs/experiments/tokenizer-and-data.md).",
    )
    preset: str = _arg("small", "Model preset: small (d_model 256, 3+3 layers, 7.6M parameters) or tiny (d_model 64).")
    dropout: float = _arg(
        0.1, "P_drop (§5.4), the paper's 0.1; 0.2 measured no better out of domain (docs/experiments/dropout.md)."
    )
    attention_dropout: float = _arg(
        0.0,
        "Dropout on the attention weights (not in the paper; 0.1 in tensor2tensor's base): alone, measured no better "
        "out of domain (docs/experiments/dropout.md).",
    )
    activation_dropout: float = _arg(
        0.3,
        "Dropout after the FFN's ReLU (not in the paper, which has 0): 0.3 measured better out of domain than 0.2, "
        "and 0.2 better than 0, every seed up each time, for a small share of a step (docs/experiments/dropout.md).",
    )
    config_overrides: str | None = _arg(
        None, "Config fields to override, e.g. 'encoder_layers=4' (wins over the three dropout flags)."
    )
    max_tokens: int = _arg(1024, "Token budget per batch and side (split evenly over the training processes).")
    num_processes: int = _arg(
        1,
        "Training processes (DDP over gloo, each with its share of the cores and of --max_tokens); 2 on 2 cores "
        "measured about the speed of one process and the same BLEU (docs/experiments/steps-and-speed.md).",
    )
    warmup_steps: int = _arg(500, "Noam warmup; the paper's 4000 would not finish within a CPU budget.")
    learning_rate: float = _arg(
        2e-3, "Noam peak; Eq. 3 gives 1e-3 for d_model 256, 2e-3 trains faster (docs/experiments/learning-rate.md)."
    )
    weight_decay: float = _arg(
        0.1,
        "Decoupled AdamW weight decay on the weight matrices (not in the paper, which uses none); it measured better "
        "out of domain, every seed up (docs/experiments/regularisation.md).",
    )
    lr_cooldown: float = _arg(
        0.2,
        "The learning rate falls linearly to 0 over this last fraction of the steps in the budget; 0: off, "
        "the paper's schedule to the end (docs/experiments/cooldown.md).",
    )
    length_penalty: float = _arg(
        1.0,
        "Beam length penalty (score / length**alpha); 1.0 measured above the paper's 0.6 "
        "(docs/experiments/decoding.md).",
    )
    bf16: bool | None = _arg(
        None,
        "bf16 autocast (default: on where the CPU multiplies bf16 natively, where it trains faster; "
        "docs/experiments/steps-and-speed.md).",
    )
    eval_steps: int = _arg(
        1000,
        "Validate (beam search, BLEU on --max_eval_samples pairs) every N steps; each validation takes some seconds "
        "of the budget (docs/experiments/steps-and-speed.md).",
    )
    save_steps: int | None = _arg(
        None,
        "Save a checkpoint every N steps, to resume from or to average (default: 100 with --average_checkpoints, "
        "so that the averaged states are close together, else 500).",
    )
    average_checkpoints: int = _arg(
        0,
        "Average the final weights with the last N-1 checkpoints (§6.1); 0: off (it did not help after the cooldown).",
    )
    max_eval_samples: int = _arg(100, "Validation pairs scored during training.")
    max_length: int = _arg(64, "Training pairs longer than this many tokens on either side are dropped.")
    max_steps: int = _arg(1_000_000, "A ceiling only: the time budget ends training.")
    min_pairs: int = _arg(1000, "Fewest clean gettext pairs accepted.")
    seed: int = _arg(42, "Random seed.")
    export_onnx: bool = _arg(True, "Also export to ONNX and translate the examples with onnxruntime (onnx extra).")
    examples: list[str] = field(
        default_factory=lambda: list(EXAMPLE_SENTENCES), metadata={"help": "Sentences to translate at the end."}
    )


ONNX_RESERVE_S = 20.0  # kept back for the ONNX export and its examples (docs/main-job.md)


def checkpoint_steps(save_steps: int | None, average_checkpoints: int) -> int:
    """Steps between checkpoints: `save_steps` when given; else 100 when the last checkpoints are averaged (they should
    be the last few hundred steps), else 500 (only to resume from: each save takes time from training)."""
    if save_steps is not None:
        if save_steps < 1:
            raise ValueError(f"--save_steps {save_steps}: give 1 or more.")
        return save_steps
    return 100 if average_checkpoints > 0 else 500


def _reserved_seconds(budget_s: float, reserve_minutes: float | None) -> float:
    """Time kept back from training for the final beam-search evaluation and the examples."""
    return reserve_minutes * 60 if reserve_minutes is not None else max(60.0, 0.05 * budget_s)


def model_overrides(
    config_overrides: str | None, *, dropout: float, attention_dropout: float = 0.0, activation_dropout: float = 0.0
) -> str:
    """The --config_overrides text of the job's model: its three dropouts, then the user's fields (a later field
    wins)."""
    dropouts = f"dropout={dropout},attention_dropout={attention_dropout},activation_dropout={activation_dropout}"
    return ",".join(item for item in (dropouts, config_overrides) if item)


def run_main_job(args: MainJobArguments) -> dict[str, Any]:
    """Run every step and return (and write to `<output_dir>/summary.json`) the figures and timings."""
    started = time.monotonic()
    budget_s = args.time_budget_minutes * 60
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    processes = args.num_processes
    if processes < 1:
        raise ValueError(f"--num_processes {args.num_processes}: give 1 or more.")
    threads = max(1, usable_cores() // processes)
    rank_max_tokens = args.max_tokens // processes
    if rank_max_tokens < args.max_length:
        raise ValueError(
            f"--max_tokens {args.max_tokens} over {processes} processes leaves {rank_max_tokens} tokens per batch, "
            f"fewer than --max_length {args.max_length}: raise --max_tokens or lower --num_processes."
        )

    def lap(name: str, since: float) -> float:
        timings[name] = round(time.monotonic() - since, 1)
        logger.info(f"[main job] {name}: {timings[name]:.1f}s")
        return time.monotonic()

    now = time.monotonic()
    corpus = gettext_corpus(args.target_lang, args.locale_dir, min_pairs=args.min_pairs)
    files = write_tsv(corpus, output / "data", "en", args.target_lang)
    now = lap("harvest", now)

    texts = (text for pair in zip(corpus["train"]["source"], corpus["train"]["target"], strict=True) for text in pair)
    tokenizer = train_bpe_tokenizer(
        texts, vocab_size=args.vocab_size, model_max_length=1024, show_progress=True,
        add_prefix_space=args.add_prefix_space,
    )  # fmt: skip
    tokenizer.save_pretrained(output / "tokenizer")
    now = lap("tokenizer", now)

    reserve_s = _reserved_seconds(budget_s, args.reserve_minutes) + (ONNX_RESERVE_S if args.export_onnx else 0.0)
    train_budget_s = budget_s - (time.monotonic() - started) - reserve_s
    if train_budget_s < 10:
        raise ValueError(f"--time_budget_minutes {args.time_budget_minutes} leaves no time to train; give it more.")
    model_dir = output / "model"
    bf16 = cpu_has_fast_bf16() if args.bf16 is None else args.bf16
    data_args = DataArguments(
        source_lang="en", target_lang=args.target_lang, tokenizer_name=str(output / "tokenizer"),
        train_file=str(files["train"]), validation_file=str(files["validation"]), test_file=str(files["test"]),
        max_source_length=args.max_length, max_target_length=args.max_length, max_eval_samples=args.max_eval_samples,
        prepared_data=str(output / "data" / "prepared"),
    )  # fmt: skip
    training_kwargs = dict(
        output_dir=str(model_dir), do_train=True, predict_with_generate=True, max_steps=args.max_steps,
        eval_strategy="steps", eval_steps=args.eval_steps,
        save_steps=checkpoint_steps(args.save_steps, args.average_checkpoints),
        save_total_limit=max(args.average_checkpoints, 2),
        logging_steps=25, warmup_steps=args.warmup_steps, learning_rate=args.learning_rate, seed=args.seed,
        weight_decay=args.weight_decay,
        report_to=["tensorboard"], use_cpu=True, bf16=bf16, per_device_eval_batch_size=64, disable_tqdm=True,
        generation_max_length=args.max_length + 16,  # gettext messages are short; bounds an untrained model's output
        ddp_find_unused_parameters=False,  # every parameter gets a gradient; DDP need not search the graph for others
    )  # fmt: skip
    recipe = RecipeArguments(
        max_tokens=rank_max_tokens,  # per process: the processes' batches together hold --max_tokens
        average_checkpoints=args.average_checkpoints,
        length_penalty=args.length_penalty,
        lr_cooldown=args.lr_cooldown,
    )
    model_args = ModelArguments(
        preset=args.preset,
        config_overrides=model_overrides(
            args.config_overrides,
            dropout=args.dropout,
            attention_dropout=args.attention_dropout,
            activation_dropout=args.activation_dropout,
        ),
    )
    corpus_name = (
        f"gettext-en-{args.target_lang}",
        f"English→{args.target_lang} messages of the GNU gettext catalogs under {args.locale_dir}, split by a hash of "
        "the English side (2% test, 2% validation)",
    )
    # The time budget ends training (max_steps is a ceiling only); with --lr_cooldown it also sizes the cooldown. It
    # is passed as a deadline, so that starting the processes counts against it too.
    deadline = time.time() + train_budget_s
    if processes > 1:
        logger.info(f"[main job] training in {processes} processes (DDP over gloo) of {threads} thread(s) each")
    show_progress = _package_logs_shown()
    show_weight_bars = debug_requested()  # for the spawned processes, which start without the command's state
    results = run_in_processes(
        _train, (model_args, data_args, training_kwargs, recipe, deadline, corpus_name, show_progress,
                 show_weight_bars),
        num_processes=processes, threads=threads,
    )[0]  # fmt: skip
    now = lap("train_and_evaluate", now)

    model, tokenizer = load_translation_model(model_dir, device="cpu")
    translations = translate(model, tokenizer, args.examples, show_progress=False)
    now = lap("examples", now)
    onnx_translations = _onnx_step(model_dir, output / "onnx", args.examples) if args.export_onnx else None
    if onnx_translations is not None:
        lap("onnx_export_and_examples", now)

    summary = {
        "test_bleu": round(results.get("test_bleu", float("nan")), 2),
        "test_chrf": round(results.get("test_chrf", float("nan")), 2),
        "test_pairs": len(corpus["test"]),
        "train_pairs": len(corpus["train"]),
        "steps": results.get("global_step") or _last_step(model_dir),
        "parameters": results.get("parameters"),
        "preset": args.preset,
        "precision": "bf16 autocast" if bf16 else "fp32",
        "lr_cooldown": args.lr_cooldown,
        "weight_decay": args.weight_decay,
        "dropout": model.config.dropout,
        "attention_dropout": model.config.attention_dropout,
        "activation_dropout": model.config.activation_dropout,
        "training_processes": processes,
        "train_tokens_seen": {
            "source": results.get("train_source_tokens"),
            "target": results.get("train_target_tokens"),
        },
        "train_tokens_per_second": results.get("train_tokens_per_second"),
        "averaged_checkpoints": results.get("averaged_checkpoints"),
        "vocab_size": len(tokenizer),
        "timings_s": {**timings, "total": round(time.monotonic() - started, 1)},
        "examples": dict(zip(args.examples, translations, strict=True)),
        "model_dir": str(model_dir),
    }
    if onnx_translations is not None:
        summary["onnx_examples"] = dict(zip(args.examples, onnx_translations, strict=True))
        summary["onnx_dir"] = str(output / "onnx")
        summary["serve_command"] = serve_command(output / "onnx", args.target_lang)
    summary["standard_layout_command"] = standard_layout_command(model_dir, output / "onnx-standard")
    (output / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return summary


def standard_layout_command(model_dir: Path, output_dir: Path) -> str:
    """The command that writes the standard layout (MarianMT config and weights, Optimum's ONNX files with int8
    beside them), for Optimum, transformers.js, the browser example and the Hub (docs/run-anywhere.md)."""
    return f"vt-export-onnx --model {model_dir} --output {output_dir} --layout optimum --quantize int8"


def serve_command(onnx_dir: Path, target_lang: str) -> str:
    """The command that serves the exported model over LibreTranslate's HTTP API (docs/serving.md)."""
    return f"vt-serve en-{target_lang}={onnx_dir} --port 5000"


def _train(
    model_args, data_args, training_kwargs, recipe, deadline, corpus, show_progress, show_weight_bars
) -> dict[str, Any]:
    """The training step of the job, in each training process: train, evaluate on the test split, save (the weight
    saving bars only with `show_weight_bars`, the command's --debug)."""
    if rank() != 0:  # one set of progress bars and logs, from rank 0
        import datasets

        datasets.disable_progress_bars()
        logging.set_verbosity_error()
    elif show_progress:
        show_package_progress()
    training_args = Seq2SeqTrainingArguments(**training_kwargs)
    with weight_progress_bars(show_weight_bars):
        return run_training(
            model_args, data_args, training_args, recipe, explicit={"warmup_steps", "learning_rate", "weight_decay"},
            time_budget_s=max(1.0, deadline - time.time()), corpus=corpus,
        )  # fmt: skip


def _package_logs_shown() -> bool:
    """Has the caller turned this package's INFO logs on (as vt-main-job does)? The processes then do the same."""
    import logging as std_logging

    return std_logging.getLogger(__name__.split(".")[0]).isEnabledFor(std_logging.INFO)


def _onnx_step(model_dir: Path, onnx_dir: Path, sentences: list[str]) -> list[str] | None:
    """Export the saved model to ONNX and translate `sentences` with onnxruntime; None if the extra is missing."""
    try:
        from vanilla_transformer_ort import OrtTranslator

        from ..export.onnx.export import export_model
    except ImportError as error:
        logger.warning(f"Skipping the ONNX step ({error}); install it with: pip install -e '.[onnx]'")
        return None
    export_model(model_dir, onnx_dir)
    return [text.strip() for text in OrtTranslator(onnx_dir).translate(list(sentences))]


def _last_step(model_dir: Path) -> int | None:
    state = model_dir / "trainer_state.json"
    if state.is_file():
        return json.loads(state.read_text()).get("global_step")
    checkpoints = [int(p.name.split("-")[1]) for p in model_dir.glob("checkpoint-*") if p.name.split("-")[1].isdigit()]
    return max(checkpoints) if checkpoints else None
