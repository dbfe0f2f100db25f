"""A local pair file read line by line (paper §5.1's data from disk): its format (TSV or CSV with a header naming
the languages, JSON lines, a Moses prefix; each plain or `.gz`), its pairs streamed with errors that name the file
and line, and UTF-8 text files. `pair_files` reads the same files into Arrow with `datasets`' builders and comes here
to name a malformed line.
"""

from __future__ import annotations

import csv
import gzip
import io
import itertools
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING

from transformers.utils import logging

if TYPE_CHECKING:
    from datasets import Dataset

logger = logging.get_logger(__name__)

PAIR_FILE_SUFFIXES = (".tsv", ".csv", ".json", ".jsonl")  # each also read gzip-compressed, with `.gz` after it


def pair_file_format(path: str | os.PathLike) -> str:
    """How a `--train_file` value is read: "tsv", "csv", "json" (JSON lines) or "moses" (a prefix naming two files).

    Raises:
        ValueError: an existing file of another format (a Moses prefix is never itself a file).
    """
    path = Path(path)
    name = path.name.lower().removesuffix(".gz")
    for suffix in PAIR_FILE_SUFFIXES:
        if name.endswith(suffix):
            return {".jsonl": "json"}.get(suffix, suffix[1:])
    if path.is_file():
        raise ValueError(
            f"{path}: unknown format {path.suffix or '(no suffix)'!r}; pass a .tsv, .csv, .json or .jsonl file (each "
            "also as .gz), or a Moses prefix (data/train for data/train.en and data/train.de)"
        )
    return "moses"


def moses_files(prefix: str | os.PathLike, source_lang: str, target_lang: str) -> tuple[Path, Path]:
    """The two files of a Moses prefix (`prefix.en`, `prefix.de`, or their `.gz`); FileNotFoundError names both."""
    found = []
    for lang in (source_lang, target_lang):
        candidates = [Path(f"{prefix}.{lang}"), Path(f"{prefix}.{lang}.gz")]
        existing = [candidate for candidate in candidates if candidate.is_file()]
        if not existing:
            raise FileNotFoundError(
                f"data file {candidates[0]} not found; a path without a .tsv/.csv/.json/.jsonl suffix is read as a "
                f"Moses prefix: {prefix}.{source_lang} and {prefix}.{target_lang} must both exist"
            )
        found.append(existing[0])
    return found[0], found[1]


def pair_file_paths(path: str | os.PathLike, source_lang: str, target_lang: str) -> list[Path]:
    """The files a `--train_file` value reads (one, or two for a Moses prefix), checked to exist."""
    if pair_file_format(path) == "moses":
        return list(moses_files(path, source_lang, target_lang))
    _require_file(Path(path))
    return [Path(path)]


def iter_parallel_file(
    path: str | os.PathLike, source_lang: str, target_lang: str, limit: int | None = None
) -> Iterator[tuple[str, str]]:
    """Stream the (source, target) pairs of a TSV/CSV/JSON-lines file or a Moses prefix (plain or `.gz`), sides
    stripped, pairs with an empty side skipped with one warning at the end; at most `limit` pairs. Nothing but the
    current line is held in memory, so corpora of any size stream through.

    Raises:
        FileNotFoundError: the file (or one of the Moses pair) does not exist.
        ValueError: the header lacks the language columns, a line is malformed or not UTF-8 (named by file and
            line), the Moses files are not parallel, or the file holds no pair.
    """
    path = Path(path)
    kind = pair_file_format(path)
    if kind in ("tsv", "csv"):
        rows = _delimited_rows(path, source_lang, target_lang, delimiter="\t" if kind == "tsv" else ",")
    elif kind == "json":
        rows = _json_rows(path, source_lang, target_lang)
    else:
        rows = _moses_rows(path, source_lang, target_lang)
    kept = skipped = 0
    for source, target in rows:
        source, target = source.strip(), target.strip()
        if not (source and target):
            skipped += 1
            continue
        if limit is not None and kept >= limit:
            break
        kept += 1
        yield source, target
    if skipped:
        logger.warning(f"{path}: skipped {skipped} pairs with an empty side.")
    if not kept:
        raise ValueError(f"{path} holds no sentence pair ({source_lang}→{target_lang}); the corpus is empty.")


def read_parallel_file(path: str | os.PathLike, source_lang: str, target_lang: str) -> Dataset:
    """One split from a TSV/CSV/JSON-lines file or a Moses prefix as an in-memory `source`/`target` dataset (for test
    sets and small corpora; training corpora are prepared on disk by `prepared.prepare_corpus`).

    Raises:
        FileNotFoundError: the file (or one of the Moses pair) does not exist.
        ValueError: the header lacks the language columns, a line is malformed, or the file holds no pair.
    """
    from datasets import Dataset

    sources, targets = [], []
    for source, target in iter_parallel_file(path, source_lang, target_lang):
        sources.append(source)
        targets.append(target)
    return Dataset.from_dict({"source": sources, "target": targets})


def _require_file(path: Path) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} not found; check the path")


def _missing_columns_error(path: Path, found: Iterable[str], source_lang: str, target_lang: str) -> ValueError:
    return ValueError(
        f"{path}: expected columns {source_lang!r} and {target_lang!r} (from --source_lang/--target_lang) but found "
        f"{sorted(found)}. Rename the header or pass the matching language codes."
    )


def _not_utf8_error(path: Path, line: int, column: int, byte: int) -> ValueError:
    return ValueError(
        f"{path}:{line}: byte 0x{byte:02x} at column {column} is not UTF-8; save the file as UTF-8 "
        "(e.g. `iconv -f latin1 -t utf-8 in > out`)."
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
        raise _not_utf8_error(path, line, column, data[error.start]) from None


def open_pair_file(path: str | os.PathLike) -> IO[str]:
    """A data file opened as UTF-8 text (a leading byte-order mark dropped), gzip-compressed when it ends in `.gz`."""
    path = Path(path)
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8-sig", newline="")
    return path.open(encoding="utf-8-sig", newline="")


def open_binary(path: str | os.PathLike) -> IO[bytes]:
    """A data file's bytes, decompressed when its name ends in `.gz`."""
    path = Path(path)
    return gzip.open(path, "rb") if path.name.lower().endswith(".gz") else path.open("rb")


def _text_lines(path: Path) -> Iterator[str]:
    """The file's lines decoded as UTF-8 (a leading byte-order mark dropped), without their line ends; a line that
    is not UTF-8 is a `ValueError` naming file, line and column."""
    _require_file(path)
    with open_binary(path) as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as error:
                raise _not_utf8_error(path, number, error.start + 1, raw[error.start]) from None
            yield line.rstrip("\r\n")


def _decoded_stream(path: Path) -> Iterator[str]:
    """The file as a stream of UTF-8 lines with their line ends (for the csv module, which needs them inside quoted
    fields); a byte that is not UTF-8 is located by line when the decoder stops on it."""
    _require_file(path)
    with open_binary(path) as handle, io.TextIOWrapper(handle, encoding="utf-8-sig", newline="") as text:
        try:
            yield from text
        except UnicodeDecodeError:
            pass
        else:
            return
    for _ in _text_lines(path):  # raises at the first line that is not UTF-8
        pass
    raise ValueError(f"{path} is not UTF-8; save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8 in > out`).")


def _row_width_error(path: Path, line: int, row: list[str], header: list[str], delimiter: str) -> ValueError:
    name = "tab" if delimiter == "\t" else "comma"
    if len(row) > len(header):
        fix = f"a {name} inside the text: " + ("quote that field." if delimiter == "," else "replace it by a space.")
    else:
        fix = f"a missing {name}" + (" or an unclosed quote." if delimiter == "," else ".")
    return ValueError(
        f"{path}:{line}: {len(row)} {name}-separated fields, but the header has {len(header)} "
        f"({delimiter.join(header)!r}); probably {fix}"
    )


def _delimited_rows(path: Path, source_lang: str, target_lang: str, delimiter: str) -> Iterator[tuple[str, str]]:
    """Rows must have as many fields as the header: a stray tab (TSV) or comma (CSV) is an error naming the line,
    since dropping or merging the extra field would train on a wrong pair. TSV files carry no quoting (a quote is
    part of the text), so a TSV line is split on tabs; CSV uses standard quoting through the csv module."""
    if delimiter == "\t":
        lines = _text_lines(path)
        header = next(lines, "").split("\t")
        if source_lang not in header or target_lang not in header:
            raise _missing_columns_error(path, header, source_lang, target_lang)
        source_column, target_column = header.index(source_lang), header.index(target_lang)
        for number, line in enumerate(lines, start=2):
            if not line:  # blank line
                continue
            row = line.split("\t")
            if len(row) != len(header):
                raise _row_width_error(path, number, row, header, delimiter)
            yield row[source_column], row[target_column]
        return
    reader = csv.reader(_decoded_stream(path), delimiter=delimiter, quoting=csv.QUOTE_MINIMAL)
    header = next(reader, [])
    if source_lang not in header or target_lang not in header:
        raise _missing_columns_error(path, header, source_lang, target_lang)
    source_column, target_column = header.index(source_lang), header.index(target_lang)
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as error:  # e.g. a field over csv.field_size_limit(), an unclosed quote
            raise ValueError(f"{path}:{reader.line_num}: {error}.") from None
        if not row:  # blank line
            continue
        if len(row) != len(header):
            raise _row_width_error(path, reader.line_num, row, header, delimiter)
        yield row[source_column], row[target_column]


def _json_rows(path: Path, source_lang: str, target_lang: str) -> Iterator[tuple[str, str]]:
    for line_number, line in enumerate(_text_lines(path), start=1):
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
        yield record[source_lang], record[target_lang]


def _moses_rows(prefix: Path, source_lang: str, target_lang: str) -> Iterator[tuple[str, str]]:
    source_path, target_path = moses_files(prefix, source_lang, target_lang)
    for count, (source, target) in enumerate(
        itertools.zip_longest(_text_lines(source_path), _text_lines(target_path)), start=1
    ):
        if source is None or target is None:
            shorter, longer = (source_path, target_path) if source is None else (target_path, source_path)
            raise ValueError(
                f"Moses files are not parallel: {shorter} has {count - 1} lines, {longer} has more; each line of "
                f"one must translate the same line of the other."
            )
        yield source, target
