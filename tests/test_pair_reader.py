"""A local pair file read line by line: TSV, CSV, JSON lines and Moses prefixes give the same pairs; a missing file,
wrong columns, an empty or unparallel corpus are errors that name it (more bad files: tests/test_bad_inputs.py)."""

import csv
import json

import pytest

from vanilla_transformer.training.pair_reader import read_parallel_file

PAIRS = [("the red house.", "das rote Haus."), ('say "hi"', 'sag "hallo"'), ("a, b", "a, b und c")]


def _assert_pairs(dataset, pairs=PAIRS):
    assert list(zip(dataset["source"], dataset["target"], strict=True)) == pairs


def test_tsv_csv_jsonl_and_moses_give_the_same_pairs(tmp_path):
    (tmp_path / "d.tsv").write_text("de\ten\n" + "".join(f"{de}\t{en}\n" for en, de in PAIRS), encoding="utf-8")
    with (tmp_path / "d.csv").open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["en", "de"])
        writer.writerows(PAIRS)
    (tmp_path / "flat.jsonl").write_text("".join(json.dumps({"en": e, "de": d}) + "\n" for e, d in PAIRS))
    nested = "".join(json.dumps({"translation": {"en": e, "de": d}}) + "\n\n" for e, d in PAIRS)
    (tmp_path / "nested.json").write_text(nested)
    (tmp_path / "train.en").write_text("\n".join(e for e, _ in PAIRS) + "\n", encoding="utf-8")
    (tmp_path / "train.de").write_text("\n".join(d for _, d in PAIRS) + "\n", encoding="utf-8")
    for name in ("d.tsv", "d.csv", "flat.jsonl", "nested.json", "train"):
        _assert_pairs(read_parallel_file(tmp_path / name, "en", "de"))


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.tsv"):
        read_parallel_file(tmp_path / "missing.tsv", "en", "de")
    (tmp_path / "only.en").write_text("x\n")
    with pytest.raises(FileNotFoundError, match=r"only\.de"):
        read_parallel_file(tmp_path / "only", "en", "de")


def test_wrong_columns_are_named(tmp_path):
    (tmp_path / "d.tsv").write_text("english\tgerman\nhi\thallo\n")
    with pytest.raises(ValueError, match=r"expected columns 'en' and 'de' .* but found \['english', 'german'\]"):
        read_parallel_file(tmp_path / "d.tsv", "en", "de")
    (tmp_path / "d.jsonl").write_text(json.dumps({"en": "hi", "fr": "salut"}) + "\n")
    with pytest.raises(ValueError, match="found \\['en', 'fr'\\]"):
        read_parallel_file(tmp_path / "d.jsonl", "en", "de")


def test_empty_and_unparallel_corpora(tmp_path):
    (tmp_path / "empty.tsv").write_text("en\tde\n")
    with pytest.raises(ValueError, match="corpus is empty"):
        read_parallel_file(tmp_path / "empty.tsv", "en", "de")
    (tmp_path / "x.en").write_text("a\nb\n")
    (tmp_path / "x.de").write_text("a\n")
    with pytest.raises(ValueError, match="not parallel"):
        read_parallel_file(tmp_path / "x", "en", "de")
