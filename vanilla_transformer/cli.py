"""The command lines: each `*_command(argv)` parses its arguments, runs, and returns what it made (for Python callers
and tests; errors raise), and each `*_main` is the matching `vt-*` console script of pyproject.toml (started through
`vanilla_transformer_cli`, which answers `--version` without importing torch), where a user error is one line on
stderr and exit status 2 (`vanilla_transformer_ort.cli_common`). `scripts/train.py` and `scripts/main_job.py` run
`train_main` and `main_job_main` from a checkout.

Flags are `--snake_case` like transformers', each also spelled `--kebab-case`; `--help` ends with an example and
`--version` prints the package's version. Heavy imports (torch, datasets) happen after the arguments are parsed.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vanilla_transformer_ort.cli_common import (
    UserError,
    add_flag_alias,
    run_cli,
)

from .cli_parsers import _hf_parser, _parser, check_model_folder
from .progress import show_package_progress, without_weight_progress_bars


def train_command(argv: list[str] | None = None) -> dict[str, Any]:
    """Train a vanilla Transformer for translation with the paper's recipe (§5) on Seq2SeqTrainer.

    Runs unchanged on one CPU/GPU or under `accelerate launch scripts/train.py` (DDP, FSDP, DeepSpeed; see
    docs/training.md). Arguments: model (--preset, --config_overrides, --model_name_or_path or --model), data
    (--train_file, --dataset_name, ...; the default is the gettext corpus of this machine), the recipe
    (--paper_recipe, --lr_schedule, --max_tokens, --length_penalty) and every `Seq2SeqTrainingArguments` flag
    (--output_dir or --output, ...). A single JSON file with all of them also works. `--debug` is transformers' own
    flag here: set VT_DEBUG=1 to see the traceback of an error.

    Example:
        vt-train --tokenizer_name out/tokenizer --output_dir out/model --preset small \\
            --do_train --predict_with_generate --max_steps 2000
    """
    from transformers import Seq2SeqTrainingArguments

    from .training.data import DataArguments
    from .training.experiment import ModelArguments, run_training
    from .training.recipe import RecipeArguments, check_precision_flags, explicit_flags

    argv = sys.argv[1:] if argv is None else argv
    parser = _hf_parser(
        (ModelArguments, DataArguments, RecipeArguments, Seq2SeqTrainingArguments), train_command, "vt-train",
        debug=False,  # Seq2SeqTrainingArguments has a --debug of its own
    )  # fmt: skip
    add_flag_alias(parser, "--output_dir", "--output")
    add_flag_alias(parser, "--model_name_or_path", "--model")
    if len(argv) == 1 and argv[0].endswith(".json"):
        with open(argv[0]) as handle:
            settings = json.load(handle)
        check_precision_flags(
            [f"--{name}={settings[name]}" for name in ("fp16", "bf16", "use_cpu") if name in settings]
        )
        model_args, data_args, recipe, training_args = parser.parse_json_file(argv[0])
        explicit = set(settings)
    else:
        check_precision_flags(argv)
        model_args, data_args, recipe, training_args = parser.parse_args_into_dataclasses(argv)
        explicit = explicit_flags(argv)
    results = run_training(model_args, data_args, training_args, recipe, explicit)
    if training_args.process_index == 0:
        print(json.dumps({k: v for k, v in results.items() if k.startswith("test_") or k == "train_loss"}, indent=2))
    return results


def train_tokenizer_command(argv: list[str] | None = None) -> Path:
    """Train the joint source+target BPE tokenizer (paper §5.1: one ~37k vocabulary shared by both languages).

    Example:
        vt-train-tokenizer --output out/tokenizer --vocab_size 8000            # gettext en→de
        vt-train-tokenizer --train_file data/train.tsv --source_lang en --target_lang de --output tok
    """
    from .training.gettext_corpus import DEFAULT_LOCALE_DIR
    from .training.tokenization import DEFAULT_VOCAB_SIZE

    parser = _parser(train_tokenizer_command, "vt-train-tokenizer")
    parser.add_argument(
        "--output", "--output_dir", required=True, help="Folder for tokenizer.json / tokenizer_config.json."
    )
    parser.add_argument("--vocab_size", type=int, default=DEFAULT_VOCAB_SIZE)
    parser.add_argument("--min_frequency", type=int, default=2)
    parser.add_argument("--source_lang", default="en")
    parser.add_argument("--target_lang", default="de")
    parser.add_argument("--train_file", help="TSV/CSV/JSON lines or Moses prefix; default: the gettext corpus.")
    parser.add_argument("--dataset_name", help="Hub dataset with a translation column (needs internet).")
    parser.add_argument("--dataset_config_name")
    parser.add_argument("--gettext_locale_dir", default=DEFAULT_LOCALE_DIR)
    parser.add_argument("--gettext_min_pairs", type=int, default=1000)
    parser.add_argument(
        "--gettext_heldout_catalogs", nargs="*", default=[], help="Catalogs held out whole (see vt-train --help)."
    )
    parser.add_argument(
        "--gettext_keep_identical", action="store_true", help="Also train on identical pairs (see vt-train --help)."
    )
    parser.add_argument("--model_max_length", type=int, default=1024)
    parser.add_argument(
        "--add_prefix_space",
        action="store_true",
        help="Encode each text as if it began with a space, so first words share the tokens of words inside a "
        "sentence (docs/training.md, 'Tokenizer').",
    )
    args = parser.parse_args(argv)

    from .training.data import DataArguments, load_parallel_data
    from .training.pair_reader import iter_parallel_file
    from .training.tokenization import train_bpe_tokenizer

    pairs = [0]
    if args.train_file:  # streamed a line at a time: a corpus of any size, never in memory

        def texts():
            for source, target in iter_parallel_file(args.train_file, args.source_lang, args.target_lang):
                pairs[0] += 1
                yield source
                yield target

    else:
        data_args = DataArguments(
            source_lang=args.source_lang, target_lang=args.target_lang, dataset_name=args.dataset_name,
            dataset_config_name=args.dataset_config_name, gettext_locale_dir=args.gettext_locale_dir,
            gettext_min_pairs=args.gettext_min_pairs, gettext_heldout_catalogs=args.gettext_heldout_catalogs,
            gettext_keep_identical=args.gettext_keep_identical,
        )  # fmt: skip
        train = load_parallel_data(data_args)["train"]  # the tokenizer never sees validation or test text

        def texts():
            for batch in train.iter(batch_size=1000):
                pairs[0] += len(batch["source"])
                yield from batch["source"]
                yield from batch["target"]

    tokenizer = train_bpe_tokenizer(
        texts(), vocab_size=args.vocab_size, min_frequency=args.min_frequency,
        model_max_length=args.model_max_length, show_progress=True, add_prefix_space=args.add_prefix_space,
    )  # fmt: skip
    tokenizer.save_pretrained(args.output)
    print(f"Saved a {len(tokenizer)}-token tokenizer ({pairs[0]} training pairs) to {args.output}")
    return Path(args.output)


def prepare_data_command(argv: list[str] | None = None) -> Path:
    """Prepare a corpus once, as fairseq-preprocess does: read the files (TSV, CSV, JSON lines, Moses; plain or .gz)
    or the Hub dataset, tokenize, drop training pairs over the length limits, and write memory-mapped Arrow files
    with a manifest into --output. `vt-train --prepared_data FOLDER` then starts from it in seconds, on every rank
    and after every restart. The folder holds its tokenizer; running again with the same data, tokenizer and limits
    reuses it.

    Example:
        vt-prepare-data --train_file data/train.tsv --validation_file data/valid.tsv --tokenizer_name out/tokenizer \
            --output data/prepared --preprocessing_num_workers 2
        vt-train --prepared_data data/prepared --output_dir out/model --preset base --do_train --max_tokens 4096
    """
    from .training.data import DataArguments

    parser = _hf_parser(DataArguments, prepare_data_command, "vt-prepare-data")
    add_flag_alias(parser, "--prepared_data", "--output")
    add_flag_alias(parser, "--prepared_data", "--output_dir")
    (data_args,) = parser.parse_args_into_dataclasses(argv)
    if not data_args.prepared_data:
        raise UserError("no folder to write: pass --output FOLDER (vt-train --prepared_data reads it)")
    if not data_args.tokenizer_name:
        raise UserError("no tokenizer: pass --tokenizer_name (train one with vt-train-tokenizer)")
    if not (data_args.train_file or data_args.dataset_name):
        raise UserError(
            "no corpus to prepare: pass --train_file (and --validation_file/--test_file) or --dataset_name"
        )

    from .training.experiment import ModelArguments, load_tokenizer
    from .training.prepared import prepare_corpus, sources_of

    sources_of(data_args)  # the data files exist and have a known format: checked before the tokenizer loads
    tokenizer = load_tokenizer(data_args, ModelArguments())
    corpus = prepare_corpus(
        data_args, tokenizer, folder=data_args.prepared_data, num_proc=data_args.preprocessing_num_workers
    )
    print(json.dumps({"prepared_data": str(corpus.folder), **corpus.stats}))
    return Path(corpus.folder)


def evaluate_command(argv: list[str] | None = None) -> dict[str, Any]:
    """sacreBLEU and chrF of a model folder on a test file (TSV/CSV/JSON lines/Moses prefix), decoded with the model's
    generation config (beam 4 after vt-train and the main job) unless --num_beams / --length_penalty are given.

    Example:
        vt-evaluate --model out/model --test_file ../shared/data/gettext-en-de/test.tsv
        vt-evaluate --model out/model --test_file test.tsv --num_beams 1 --output hypotheses.de
    """
    parser = _parser(evaluate_command, "vt-evaluate")
    parser.add_argument("--model", required=True, help="Model folder (vt-train --output_dir).")
    parser.add_argument("--test_file", required=True)
    parser.add_argument("--source_lang", default="en")
    parser.add_argument("--target_lang", default="de")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--num_beams", type=int, help="Beam size (default: the model's, 4 after vt-train).")
    parser.add_argument(
        "--length_penalty", type=float, help="Default: the model's (0.6 after vt-train, 1.0 after the main job)."
    )
    parser.add_argument("--max_samples", type=int, help="Score only the first N pairs.")
    parser.add_argument("--output", "--output_file", help="Also write the translations to this file.")
    parser.add_argument("--device")
    args = parser.parse_args(argv)
    check_model_folder(args.model, must_exist=True)  # before the test file: the cheaper mistake first

    from .inference import evaluate_translations, load_translation_model
    from .training.pair_reader import read_parallel_file

    test = read_parallel_file(args.test_file, args.source_lang, args.target_lang)
    if args.max_samples:
        test = test.select(range(min(args.max_samples, len(test))))
    model, tokenizer = load_translation_model(args.model, args.device)
    scores, hypotheses = evaluate_translations(
        model, tokenizer, test["source"], test["target"], batch_size=args.batch_size, num_beams=args.num_beams,
        length_penalty=args.length_penalty,
    )  # fmt: skip
    if args.output:
        Path(args.output).write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
    result = {"bleu": round(scores["bleu"], 2), "chrf": round(scores["chrf"], 2), "pairs": len(test)}
    print(json.dumps(result))
    return result


def translate_command(argv: list[str] | None = None) -> list[str]:
    """Translate a file (one sentence per line) or stdin with a trained model, in batches with beam search.

    Example:
        echo "File not found." | vt-translate --model out/model
        vt-translate --model out/model --input news.en --output news.de --num_beams 4
    """
    parser = _parser(translate_command, "vt-translate")
    parser.add_argument("--model", required=True, help="Model folder (vt-train --output_dir).")
    parser.add_argument("--input", "--input_file", help="Sentences to translate, one per line (default: stdin).")
    parser.add_argument("--output", "--output_file", help="Where to write translations (default: stdout).")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--num_beams", type=int, help="Beam size (default: the model's, 4 after paper training).")
    parser.add_argument(
        "--length_penalty", type=float, help="Default: the model's (0.6 after vt-train, 1.0 after the main job)."
    )
    parser.add_argument("--max_length", type=int, help="Longest output in tokens (default: the model's).")
    parser.add_argument("--device", help="cpu, cuda, ... (default: cuda when available).")
    parser.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's, one per core).")
    args = parser.parse_args(argv)
    if args.input and not Path(args.input).is_file():
        parser.error(f"--input {args.input} does not exist")
    check_model_folder(args.model, must_exist=True)

    from .inference import load_translation_model, translate
    from .training.pair_reader import read_text_file

    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    # a non-UTF-8 byte in --input is an error naming the line
    lines = (read_text_file(Path(args.input)) if args.input else sys.stdin.read()).splitlines()
    model, tokenizer = load_translation_model(args.model, args.device)
    translations = translate(
        model, tokenizer, lines, batch_size=args.batch_size, num_beams=args.num_beams,
        length_penalty=args.length_penalty, max_length=args.max_length,
    )  # fmt: skip
    text = "\n".join(translations) + ("\n" if translations else "")
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return translations


def average_checkpoints_command(argv: list[str] | None = None) -> Path:
    """Average the last N checkpoints of a training run into a loadable model folder (paper §6.1: 5 for base, 20 for
    big).

    Example:
        vt-average-checkpoints --run_dir out/model --num_checkpoints 5 --output out/model-avg5
    """
    parser = _parser(average_checkpoints_command, "vt-average-checkpoints")
    parser.add_argument("--run_dir", required=True, help="A vt-train --output_dir with checkpoint-* folders.")
    parser.add_argument("--num_checkpoints", type=int, default=5)
    parser.add_argument("--output", "--output_dir", required=True, help="Model folder to write.")
    args = parser.parse_args(argv)

    from .training.averaging import average_checkpoints, last_checkpoints

    checkpoints = last_checkpoints(args.run_dir, args.num_checkpoints)
    output = average_checkpoints(checkpoints, args.output)
    print(f"Averaged {', '.join(c.name for c in checkpoints)} into {output}")
    return output


def main_job_command(argv: list[str] | None = None) -> dict[str, Any]:
    """The main job: harvest the English→German gettext corpus of this machine, train the tokenizer and a small
    Transformer on the CPU within a time budget (default 20 minutes), report BLEU/chrF on the held-out split, save the
    model and translate a few examples.

    Example:
        vt-main-job                          # everything, about 20 minutes
        vt-main-job --time_budget_minutes 5  # a quicker, weaker run
    """
    from .training.main_job import MainJobArguments, run_main_job

    parser = _hf_parser(MainJobArguments, main_job_command, "vt-main-job")
    add_flag_alias(parser, "--output_dir", "--output")
    args = parser.parse_args_into_dataclasses(argv)[0]  # a stray --debug (run_cli's) comes second
    show_package_progress()
    summary = run_main_job(args)
    print(json.dumps(summary, indent=2, ensure_ascii=False))
    print(f"\nBLEU {summary['test_bleu']}  chrF {summary['test_chrf']}  on {summary['test_pairs']} held-out pairs; "
          f"model in {summary['model_dir']}")  # fmt: skip
    if "serve_command" in summary:
        print(f"Serve it (pip install -e '.[serve]'): {summary['serve_command']}")
    print(f"For Optimum, transformers.js and the browser: {summary['standard_layout_command']}")
    return summary


# --------------------------------------------------------------------------------------------------------------------
# Console scripts ([project.scripts] in pyproject.toml)
# --------------------------------------------------------------------------------------------------------------------


def _console_script(
    command: Callable[[list[str] | None], Any], prog: str, debug_flag: bool = True
) -> Callable[[list[str] | None], int]:
    """`command` as the console script `prog`: its exit status is the int it returns, else 0 (what it made is for
    Python callers; the console-script wrapper passes a return value to `sys.exit`), and a user error is one line
    on stderr with status 2 (`run_cli`). transformers' weight loading and saving bars show only with `--debug`."""

    @functools.wraps(command)
    def main(argv: list[str] | None = None) -> int:
        return run_cli(without_weight_progress_bars(command), argv, prog=prog, debug_flag=debug_flag)

    return main


train_main = _console_script(train_command, "vt-train", debug_flag=False)
train_tokenizer_main = _console_script(train_tokenizer_command, "vt-train-tokenizer")
prepare_data_main = _console_script(prepare_data_command, "vt-prepare-data")
evaluate_main = _console_script(evaluate_command, "vt-evaluate")
translate_main = _console_script(translate_command, "vt-translate")
average_checkpoints_main = _console_script(average_checkpoints_command, "vt-average-checkpoints")
main_job_main = _console_script(main_job_command, "vt-main-job")
