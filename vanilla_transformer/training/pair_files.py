"""The text of a corpus's splits as memory-mapped Arrow files, read by `datasets`' own builders (paper §5.1's data
at any scale): the csv, json and text builders stream a file in chunks through C parsers, a Hub dataset comes through
`load_dataset`. What the parsers cannot say (the line of a malformed row, a TSV row short of a field) the streaming
reader of `data` finds by reading the file again, line by line.
"""

from __future__ import annotations

import csv
from pathlib import Path

from datasets import Dataset, Features, Value, concatenate_datasets

from .data import DataArguments, load_parallel_data, normalize_translation_dataset
from .pair_reader import iter_parallel_file, moses_files, open_binary, open_pair_file, pair_file_format


def read_raw_splits(args: DataArguments, cache_dir: Path) -> dict[str, Dataset]:
    """The text splits as memory-mapped Arrow files: local files through `datasets`' own csv/json/text builders
    (C parsers that stream the file in chunks; `.gz` is read as it is), a Hub dataset through `load_dataset`;
    `source`/`target` columns, pairs with an empty side dropped when a sample limit counts pairs."""
    if not (args.train_file or args.validation_file or args.test_file):
        return dict(load_parallel_data(args).items())  # a Hub dataset: datasets' cache, normalised by a map step
    files = {"train": args.train_file, "validation": args.validation_file, "test": args.test_file}
    limits = {"train": args.max_train_samples, "validation": args.max_eval_samples, "test": args.max_predict_samples}
    raw = {}
    for split, path in files.items():
        if not path:
            continue
        try:
            dataset = _load_pair_file(path, args.source_lang, args.target_lang, cache_dir / split)
        except Exception:
            # The builders' parsers name no line (or a wrong one); the streaming reader names file, line and fix.
            _validate(path, args.source_lang, args.target_lang)
            raise
        if limits[split] is not None:  # the first N pairs with text on both sides, as the streaming reader counts
            dataset = dataset.filter(_has_text, batched=True, input_columns=["source", "target"], desc="Pairs")
            dataset = dataset.select(range(min(limits[split], len(dataset))))
        raw[split] = dataset
    return raw


def _validate(path: str, source_lang: str, target_lang: str) -> None:
    """Read the file line by line with the streaming reader, which raises at the first malformed line."""
    for _ in iter_parallel_file(path, source_lang, target_lang):
        pass


def _has_text(sources: list[str | None], targets: list[str | None]) -> list[bool]:
    return [bool(s and s.strip()) and bool(t and t.strip()) for s, t in zip(sources, targets, strict=True)]


def _load_pair_file(path: str, source_lang: str, target_lang: str, cache_dir: Path) -> Dataset:
    """One file (or Moses pair) with `datasets`' builders, as `source`/`target` string columns. The builders' own
    error logs are hushed: a failure is reported once, by line, by the caller."""
    from datasets.utils import logging as datasets_logging

    verbosity = datasets_logging.get_verbosity()
    datasets_logging.set_verbosity(datasets_logging.CRITICAL)
    try:
        return _load_with_builders(path, source_lang, target_lang, cache_dir)
    finally:
        datasets_logging.set_verbosity(verbosity)


def _load_with_builders(path: str, source_lang: str, target_lang: str, cache_dir: Path) -> Dataset:
    from datasets import load_dataset

    text = Value("string")
    common = {"split": "train", "cache_dir": str(cache_dir)}
    kind = pair_file_format(path)
    if kind == "moses":
        sides = [
            load_dataset("text", data_files=str(side), encoding="utf-8", **common).rename_column("text", name)
            for side, name in zip(moses_files(path, source_lang, target_lang), ("source", "target"), strict=True)
        ]
        return concatenate_datasets(sides, axis=1)  # a ValueError when the two files differ in length
    if kind == "json":
        dataset = load_dataset("json", data_files=str(path), **common)
    else:
        # Every field is text as written: no NA markers, no quoting in TSV (a quote is part of the text).
        with open_pair_file(path) as handle:
            header = handle.readline().rstrip("\r\n").split("\t" if kind == "tsv" else ",")
        options = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if kind == "tsv" else {"delimiter": ","}
        dataset = load_dataset(
            "csv", data_files=str(path), encoding="utf-8-sig", keep_default_na=False, na_filter=False,
            features=Features({name: text for name in header}), **options, **common,
        )  # fmt: skip
        if not _fields_complete(path, kind, dataset, len(header)):
            _validate(path, source_lang, target_lang)  # names the line that lacks a field; else the empties are real
    return normalize_translation_dataset({"train": dataset}, source_lang, target_lang)["train"]


def _fields_complete(path: str, kind: str, dataset: Dataset, width: int) -> bool:
    """Whether no line had fewer fields than the header: pandas fills a missing field with "" (one with too many is
    its own error). A TSV line holds exactly `width - 1` tabs, so the file must hold `(rows + 1) · (width - 1)` of
    them (counted at memory speed); a CSV field may hold a quoted comma, so there an empty field means a rescan."""
    if kind == "tsv":
        tabs = 0
        with open_binary(path) as handle:
            while chunk := handle.read(1 << 24):
                tabs += chunk.count(b"\t")
        return tabs == (len(dataset) + 1) * (width - 1)
    import pyarrow.compute as pc

    table = dataset.with_format("arrow")[:]
    return not any(pc.any(pc.equal(pc.utf8_length(column), 0)).as_py() for column in table.columns)
