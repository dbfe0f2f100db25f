"""Parallel corpora for the translation task (paper §5.1): loading and tokenization.

Every source ends up as a `datasets.DatasetDict` with string columns `source` and `target` and splits `train`,
`validation` and (when available) `test`. Sources:

- local files: TSV/CSV with a header naming the languages, JSON lines (`{"en": ..., "de": ...}` or
  `{"translation": {"en": ..., "de": ...}}`), or Moses-style pairs of plain-text files given by their common prefix
  (`data/train` for `data/train.en` + `data/train.de`);
- a Hub dataset with a `translation` column (`wmt14`, `de-en`), for users online;
- the embedded default: English→X pairs harvested from the gettext catalogs installed on the machine
  (`gettext_corpus.py`).
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from transformers.utils import logging

from .gettext_corpus import DEFAULT_LOCALE_DIR, fold_whitespace, gettext_corpus

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
        default=None, metadata={"help": "Hub dataset with a `translation` column, e.g. wmt14 (needs internet)."}
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
        default=None, metadata={"help": "Folder of a tokenizer from scripts/train_tokenizer.py (or a model folder)."}
    )
    max_source_length: int = field(default=128, metadata={"help": "Pairs with a longer source are dropped."})
    max_target_length: int = field(default=128, metadata={"help": "Pairs with a longer target are dropped."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep only the first N training pairs."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep only the first N validation pairs."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep only the first N test pairs."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for datasets.map."})


# --------------------------------------------------------------------------------------------------------------------
# Local files
# --------------------------------------------------------------------------------------------------------------------


def read_parallel_file(path: str | os.PathLike, source_lang: str, target_lang: str) -> Dataset:
    """Read one split from a TSV/CSV/JSON-lines file or a Moses prefix into a `source`/`target` dataset.

    Raises:
        FileNotFoundError: the file (or one of the Moses pair) does not exist.
        ValueError: the header lacks the language columns, or the file holds no pair.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in (".tsv", ".csv"):
        sources, targets = _read_delimited(path, source_lang, target_lang, delimiter="\t" if suffix == ".tsv" else ",")
    elif suffix in (".json", ".jsonl"):
        sources, targets = _read_json_lines(path, source_lang, target_lang)
    else:
        sources, targets = _read_moses(path, source_lang, target_lang)
    pairs = [(s.strip(), t.strip()) for s, t in zip(sources, targets, strict=True)]
    kept = [(s, t) for s, t in pairs if s and t]
    if len(kept) < len(pairs):
        logger.warning(f"{path}: skipped {len(pairs) - len(kept)} pairs with an empty side.")
    if not kept:
        raise ValueError(f"{path} holds no sentence pair ({source_lang}→{target_lang}); the corpus is empty.")
    from datasets import Dataset

    return Dataset.from_dict({"source": [s for s, _ in kept], "target": [t for _, t in kept]})


def _require_file(path: Path) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} not found; check the path")


def _missing_columns_error(path: Path, found: Iterable[str], source_lang: str, target_lang: str) -> ValueError:
    return ValueError(
        f"{path}: expected columns {source_lang!r} and {target_lang!r} (from --source_lang/--target_lang) but found "
        f"{sorted(found)}. Rename the header or pass the matching language codes."
    )


def read_text_file(path: Path) -> str:
    """The whole file as UTF-8 text (a leading byte-order mark is dropped); a `ValueError` naming the file and line
    of the first byte that is not UTF-8."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - (data.rfind(b"\n", 0, error.start) + 1) + 1
        raise ValueError(
            f"{path}:{line}: byte 0x{data[error.start]:02x} at column {column} is not UTF-8; save the file as UTF-8 "
            "(e.g. `iconv -f latin1 -t utf-8 in > out`)."
        ) from None


def _read_delimited(path: Path, source_lang: str, target_lang: str, delimiter: str) -> tuple[list[str], list[str]]:
    """Rows must have as many fields as the header: a stray tab (TSV) or comma (CSV) is an error naming the line,
    since dropping or merging the extra field would train on a wrong pair."""
    _require_file(path)
    # TSV files carry no quoting (a quote is part of the text); CSV uses standard quoting.
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    reader = csv.reader(io.StringIO(read_text_file(path), newline=""), delimiter=delimiter, quoting=quoting)
    header = next(reader, [])
    if source_lang not in header or target_lang not in header:
        raise _missing_columns_error(path, header, source_lang, target_lang)
    source_column, target_column = header.index(source_lang), header.index(target_lang)
    name = "tab" if delimiter == "\t" else "comma"
    sources, targets = [], []
    rows = iter(reader)
    while True:
        try:
            row = next(rows)
        except StopIteration:
            break
        except csv.Error as error:  # e.g. a field over csv.field_size_limit(), an unclosed quote
            raise ValueError(f"{path}:{reader.line_num}: {error}.") from None
        if not row:  # blank line
            continue
        if len(row) != len(header):
            if len(row) > len(header):
                fix = f"a {name} inside the text: " + (
                    "quote that field." if delimiter == "," else "replace it by a space."
                )
            else:
                fix = f"a missing {name}" + (" or an unclosed quote." if delimiter == "," else ".")
            raise ValueError(
                f"{path}:{reader.line_num}: {len(row)} {name}-separated fields, but the header has {len(header)} "
                f"({delimiter.join(header)!r}); probably {fix}"
            )
        sources.append(row[source_column])
        targets.append(row[target_column])
    return sources, targets


def _read_json_lines(path: Path, source_lang: str, target_lang: str) -> tuple[list[str], list[str]]:
    _require_file(path)
    sources, targets = [], []
    for line_number, line in enumerate(read_text_file(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{path}:{line_number} is not valid JSON ({error}); expected one object per line."
            ) from None
        record = record.get("translation", record) if isinstance(record, dict) else {}
        if source_lang not in record or target_lang not in record:
            raise _missing_columns_error(path, record.keys(), source_lang, target_lang)
        for value in (record[source_lang], record[target_lang]):
            if not isinstance(value, str):
                raise ValueError(f"{path}:{line_number}: expected text, got {type(value).__name__} {value!r}.")
        sources.append(record[source_lang])
        targets.append(record[target_lang])
    return sources, targets


def _read_moses(prefix: Path, source_lang: str, target_lang: str) -> tuple[list[str], list[str]]:
    source_path = Path(f"{prefix}.{source_lang}")
    target_path = Path(f"{prefix}.{target_lang}")
    for candidate in (source_path, target_path):
        if not candidate.is_file():
            raise FileNotFoundError(
                f"data file {candidate} not found; a path without a .tsv/.csv/.json/.jsonl suffix is read as a "
                f"Moses prefix: {prefix}.{source_lang} and {prefix}.{target_lang} must both exist"
            )
    sources = read_text_file(source_path).splitlines()
    targets = read_text_file(target_path).splitlines()
    if len(sources) != len(targets):
        raise ValueError(
            f"Moses files are not parallel: {source_path} has {len(sources)} lines, {target_path} has {len(targets)}."
        )
    return sources, targets


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
    """Tokenize `source`/`target` (batched `datasets.map`), drop over-length pairs, keep their lengths.

    Returns:
        The dataset with `input_ids`, `attention_mask`, `labels`, `source_length`, `target_length` and `length`
        (the longer of the two, for `train_sampling_strategy="group_by_length"`), and the number of pairs dropped.
    """
    missing = {"source", "target"} - set(dataset.column_names)
    if missing:
        raise ValueError(f"Cannot tokenize: columns {sorted(missing)} are missing (found {dataset.column_names}).")

    def encode(batch):
        encoded = tokenizer(batch["source"], text_target=batch["target"], truncation=False)
        encoded["source_length"] = [len(ids) for ids in encoded["input_ids"]]
        encoded["target_length"] = [len(ids) for ids in encoded["labels"]]
        encoded["length"] = [
            max(s, t) for s, t in zip(encoded["source_length"], encoded["target_length"], strict=True)
        ]
        return encoded

    tokenized = dataset.map(
        encode, batched=True, num_proc=num_proc, remove_columns=dataset.column_names, desc="Tokenizing"
    )

    def fits(batch):
        return [
            s <= max_source_length and t <= max_target_length
            for s, t in zip(batch["source_length"], batch["target_length"], strict=True)
        ]

    kept = tokenized.filter(fits, batched=True, num_proc=num_proc, desc="Filtering long pairs")
    dropped = len(tokenized) - len(kept)
    if dropped:
        logger.warning(
            f"Dropped {dropped} of {len(tokenized)} pairs longer than {max_source_length} source / "
            f"{max_target_length} target tokens."
        )
    if len(kept) == 0:
        raise ValueError(
            f"Every pair is longer than max_source_length={max_source_length}/max_target_length={max_target_length}."
        )
    return kept, dropped
