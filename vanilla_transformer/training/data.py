"""Parallel corpora for the translation task (paper §5.1): loading and tokenization.

Every source ends up as a `datasets.DatasetDict` with string columns `source` and `target` and splits `train`,
`validation` and (when available) `test`. Sources:

- local files: TSV/CSV with a header naming the languages, JSON lines (`{"en": ..., "de": ...}` or
  `{"translation": {"en": ..., "de": ...}}`), or Moses-style pairs of plain-text files given by their common prefix
  (`data/train` for `data/train.en` + `data/train.de`), read by `pair_reader`;
- a Hub dataset with a `translation` column (`wmt14`, `de-en`), for users online;
- the embedded default: English→X pairs harvested from the gettext catalogs installed on the machine
  (`gettext_corpus.py`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from transformers.utils import logging

from .gettext_corpus import DEFAULT_LOCALE_DIR, fold_whitespace, gettext_corpus
from .pair_reader import read_parallel_file

if TYPE_CHECKING:  # imported where used: `--help` of the training commands works without the train extra
    from datasets import Dataset, DatasetDict

logger = logging.get_logger(__name__)


@dataclass
class DataArguments:
    """Where the parallel data comes from and how it is cut (parsed by `HfArgumentParser`)."""

    source_lang: str = field(default="en", metadata={"help": "Source language code (column / file suffix)."})
    target_lang: str = field(default="de", metadata={"help": "Target language code (column / file suffix)."})
    train_file: str | None = field(
        default=None,
        metadata={"help": "Training data: .tsv/.csv with a header, .json/.jsonl, or a Moses prefix (data/train)."},
    )
    validation_file: str | None = field(default=None, metadata={"help": "Validation data, same formats."})
    test_file: str | None = field(default=None, metadata={"help": "Test data, same formats."})
    dataset_name: str | None = field(
        default=None,
        metadata={"help": "Hub dataset with a `translation` column, e.g. wmt14 (needs internet), or a local copy."},
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Hub dataset config, e.g. de-en."})
    gettext_locale_dir: str = field(
        default=DEFAULT_LOCALE_DIR,
        metadata={"help": "Where gettext catalogs live; used when no file or dataset is given (the default)."},
    )
    gettext_min_pairs: int = field(
        default=1000, metadata={"help": "Fewest cleaned gettext pairs accepted before asking for other data."}
    )
    gettext_heldout_catalogs: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Hold these gettext catalogs out whole (file stems, e.g. gtk20; `desktop` names the desktop "
            "stack's interface catalogs): they become the test split, a text domain never trained on."
        },
    )
    gettext_keep_identical: bool = field(
        default=False,
        metadata={
            "help": "Also train on gettext pairs whose translation equals the source (names, formats, option "
            "syntax): copying examples. Validation and test never contain them."
        },
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Folder of a tokenizer from vt-train-tokenizer (or a model folder)."}
    )
    max_source_length: int = field(default=128, metadata={"help": "Pairs with a longer source are dropped."})
    max_target_length: int = field(default=128, metadata={"help": "Pairs with a longer target are dropped."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only the first N training pairs."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep only the first N validation pairs."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep only the first N test pairs."})
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "Processes that tokenize the corpus (datasets.map); default: this one."}
    )
    prepared_data: str | None = field(
        default=None,
        metadata={
            "help": "Folder of the prepared (tokenized, memory-mapped) corpus: read from it when it was prepared from "
            "the same files, tokenizer and limits, else prepared into it. Alone, it names a folder vt-prepare-data "
            "wrote. Default for files and Hub datasets: a folder in datasets' cache."
        },
    )


# --------------------------------------------------------------------------------------------------------------------
# Hub-style datasets
# --------------------------------------------------------------------------------------------------------------------


def normalize_translation_dataset(dataset: DatasetDict, source_lang: str, target_lang: str) -> DatasetDict:
    """Turn a Hub-style dataset (a `translation` column of `{lang: text}` dicts, or one column per language) into
    `source`/`target` columns; `valid`/`dev` splits are renamed `validation`."""
    normalized = {}
    for split, part in dataset.items():
        split = {"valid": "validation", "dev": "validation"}.get(split, split)
        columns = part.column_names
        if "translation" in columns:
            first = part[0]["translation"] if len(part) else {}
            if source_lang not in first or target_lang not in first:
                raise ValueError(
                    f"Split {split!r}: the `translation` column has languages {sorted(first)}, not "
                    f"{source_lang!r} and {target_lang!r}. Pass matching --source_lang/--target_lang."
                )

            def flatten(batch):
                return {
                    "source": [pair[source_lang] for pair in batch["translation"]],
                    "target": [pair[target_lang] for pair in batch["translation"]],
                }

            part = part.map(flatten, batched=True, remove_columns=columns, desc=f"Reading {split}")
        elif source_lang in columns and target_lang in columns:
            part = part.select_columns([source_lang, target_lang])
            part = part.rename_columns({source_lang: "source", target_lang: "target"})
        else:
            raise ValueError(
                f"Split {split!r} has columns {columns}: expected a `translation` column or columns "
                f"{source_lang!r} and {target_lang!r}."
            )
        if len(part) == 0:
            raise ValueError(f"Split {split!r} of the dataset is empty.")
        normalized[split] = part
    if "train" not in normalized:
        raise ValueError(f"The dataset has no `train` split (found {sorted(normalized)}).")
    from datasets import DatasetDict

    return DatasetDict(normalized)


# --------------------------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------------------------


def write_tsv(dataset: DatasetDict, out_dir: str | os.PathLike, source_lang: str, target_lang: str) -> dict[str, Path]:
    """Write each split as `<out_dir>/<split>.tsv` with a `source_lang<TAB>target_lang` header (no quoting)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, part in dataset.items():
        name = "valid" if split == "validation" else split
        path = out_dir / f"{name}.tsv"
        with path.open("w", encoding="utf-8") as handle:
            handle.write(f"{source_lang}\t{target_lang}\n")
            for source, target in zip(part["source"], part["target"], strict=True):
                handle.write(f"{fold_whitespace(source)}\t{fold_whitespace(target)}\n")
        paths[split] = path
    return paths


# --------------------------------------------------------------------------------------------------------------------
# One entry point and tokenization
# --------------------------------------------------------------------------------------------------------------------


def load_parallel_data(args: DataArguments) -> DatasetDict:
    """Load the corpus the arguments name: local files, else a Hub dataset, else the gettext default."""
    from datasets import DatasetDict

    if args.train_file or args.validation_file or args.test_file:
        if not args.train_file:
            raise ValueError("--validation_file/--test_file were given without --train_file.")
        files = {"train": args.train_file, "validation": args.validation_file, "test": args.test_file}
        dataset = DatasetDict(
            {
                split: read_parallel_file(path, args.source_lang, args.target_lang)
                for split, path in files.items()
                if path
            }
        )
    elif args.dataset_name:
        import datasets

        raw = datasets.load_dataset(args.dataset_name, args.dataset_config_name)
        dataset = normalize_translation_dataset(raw, args.source_lang, args.target_lang)
    else:
        if args.source_lang != "en":
            raise ValueError(
                f"The gettext default gives English→X pairs, but --source_lang is {args.source_lang!r}. "
                "Use --source_lang en, or pass --train_file/--dataset_name."
            )
        dataset = gettext_corpus(
            args.target_lang, args.gettext_locale_dir, min_pairs=args.gettext_min_pairs,
            heldout_catalogs=args.gettext_heldout_catalogs, keep_identical=args.gettext_keep_identical,
        )  # fmt: skip
    if args.max_train_samples is not None:
        dataset["train"] = dataset["train"].select(range(min(args.max_train_samples, len(dataset["train"]))))
    for split, limit in (("validation", args.max_eval_samples), ("test", args.max_predict_samples)):
        if limit is not None and split in dataset:
            dataset[split] = dataset[split].select(range(min(limit, len(dataset[split]))))
    return dataset


def tokenize_parallel(
    dataset: Dataset,
    tokenizer,
    max_source_length: int,
    max_target_length: int,
    num_proc: int | None = None,
) -> tuple[Dataset, int]:
    """Tokenize an in-memory `source`/`target` dataset and drop over-length pairs (`pair_encoding.tokenize_pairs`;
    corpora on disk are prepared with `prepared.prepare_corpus`).

    Returns:
        The dataset with `input_ids`, `labels`, `source_length`, `target_length` and `length` (the longer of the two,
        for `train_sampling_strategy="group_by_length"`), and the number of pairs dropped.
    """
    from .pair_encoding import tokenize_pairs

    tokenized = tokenize_pairs(dataset, tokenizer, max_source_length, max_target_length, num_proc=num_proc)
    dropped = len(dataset) - len(tokenized)
    if dropped:
        logger.warning(
            f"Dropped {dropped} of {len(dataset)} pairs: an empty side, or longer than {max_source_length} source / "
            f"{max_target_length} target tokens."
        )
    if len(tokenized) == 0:
        raise ValueError(
            f"Every pair is longer than max_source_length={max_source_length}/max_target_length={max_target_length}."
        )
    return tokenized, dropped
