"""Parallel data sources (local files, gettext catalogs, Hub-style datasets), cleaning, splitting, tokenization."""

import pytest
from datasets import Dataset, DatasetDict
from transformers import AutoTokenizer

from tests.training_fixtures import *  # noqa: F403 (pytest fixtures)
from tests.training_fixtures import write_mo
from vanilla_transformer.training.data import (
    DataArguments,
    load_parallel_data,
    normalize_translation_dataset,
    tokenize_parallel,
    write_tsv,
)
from vanilla_transformer.training.gettext_corpus import clean_pairs, gettext_corpus, read_mo_catalog, split_of
from vanilla_transformer.training.pair_reader import read_parallel_file

PAIRS = [("the red house.", "das rote Haus."), ('say "hi"', 'sag "hallo"'), ("a, b", "a, b und c")]


def _assert_pairs(dataset, pairs=PAIRS):
    assert list(zip(dataset["source"], dataset["target"], strict=True)) == pairs


# ---------------------------------------------------------------- local files (line by line: test_pair_reader.py)


def test_load_parallel_data_from_files(toy_data_dir):
    args = DataArguments(
        train_file=str(toy_data_dir / "train.tsv"),
        validation_file=str(toy_data_dir / "valid.tsv"),
        test_file=str(toy_data_dir / "test.tsv"),
        max_train_samples=100,
        max_predict_samples=7,
    )
    dataset = load_parallel_data(args)
    assert {split: len(part) for split, part in dataset.items()} == {"train": 100, "validation": 40, "test": 7}


def test_validation_without_train_file_is_refused(tmp_path):
    with pytest.raises(ValueError, match="without --train_file"):
        load_parallel_data(DataArguments(validation_file=str(tmp_path / "v.tsv")))


# ---------------------------------------------------------------- Hub-style datasets


def test_hub_style_translation_column_in_memory():
    raw = DatasetDict(
        {
            "train": Dataset.from_dict({"translation": [{"de": d, "en": e} for e, d in PAIRS]}),
            "valid": Dataset.from_dict({"translation": [{"de": "x y", "en": "x"}]}),
        }
    )
    dataset = normalize_translation_dataset(raw, "en", "de")
    assert sorted(dataset) == ["train", "validation"]
    _assert_pairs(dataset["train"])
    reversed_ = normalize_translation_dataset(raw, "de", "en")
    assert reversed_["validation"][0] == {"source": "x y", "target": "x"}
    with pytest.raises(ValueError, match=r"languages \['de', 'en'\], not 'en' and 'fr'"):
        normalize_translation_dataset(raw, "en", "fr")
    with pytest.raises(ValueError, match="expected a `translation` column"):
        normalize_translation_dataset(DatasetDict({"train": Dataset.from_dict({"text": ["a"]})}), "en", "de")


# ---------------------------------------------------------------- gettext


def _tiny_locale(tmp_path, count=60):
    messages = {f"Cannot open file number {i}": f"Datei Nummer {i} kann nicht geöffnet werden" for i in range(count)}
    messages.update(
        {
            "menu\x04Open": "Öffnen",  # context entry: dropped
            "%d file\x00%d files": "%d Datei\x00%d Dateien",  # plural entry: dropped
            "OK": "OK",  # identical sides: dropped
            "x": "y",  # too short: dropped
            "Line one\n\tand  line two": "Zeile eins\nund Zeile zwei",  # whitespace folded
            "Go": "Gehe jetzt sofort und ohne Umwege dorthin",  # length ratio > 3: dropped
        }
    )
    write_mo(tmp_path / "de" / "LC_MESSAGES" / "alpha.mo", messages)
    # a second catalog repeating an English source: the first translation (alphabetical file order) is kept
    write_mo(tmp_path / "de" / "LC_MESSAGES" / "beta.mo", {"Cannot open file number 0": "Anders übersetzt"})
    return tmp_path


def test_read_mo_catalog_drops_header_context_and_plurals(tmp_path):
    _tiny_locale(tmp_path)
    pairs = dict(read_mo_catalog(tmp_path / "de" / "LC_MESSAGES" / "alpha.mo"))
    assert "" not in pairs and "menu\x04Open" not in pairs and "Open" not in pairs
    assert not any("file" in key and "%d" in key for key in pairs)
    assert pairs["Cannot open file number 7"] == "Datei Nummer 7 kann nicht geöffnet werden"


def test_gettext_corpus_is_clean_deduplicated_and_split_by_hash(tmp_path):
    locale = _tiny_locale(tmp_path, count=300)
    dataset = gettext_corpus("de", locale, min_pairs=10, valid_fraction=0.1, test_fraction=0.1)
    everything = {s: t for part in dataset.values() for s, t in zip(part["source"], part["target"], strict=True)}
    assert len(everything) == sum(len(part) for part in dataset.values()) == 301  # 300 + the folded one
    assert everything["Line one and line two"] == "Zeile eins und Zeile zwei"
    assert everything["Cannot open file number 0"] == "Datei Nummer 0 kann nicht geöffnet werden"
    assert not {"OK", "x", "Go", "Open"} & set(everything)
    for split, part in dataset.items():
        assert all(split_of(s, 0.1, 0.1) == split for s in part["source"])
    assert 10 < len(dataset["test"]) < 60 and 10 < len(dataset["validation"]) < 60
    again = gettext_corpus("de", locale, min_pairs=10, valid_fraction=0.1, test_fraction=0.1)
    assert again["test"]["source"] == dataset["test"]["source"]  # deterministic


def test_heldout_catalogs_become_the_test_split_and_never_train(tmp_path):
    locale = _tiny_locale(tmp_path, count=300)
    ui = {f"Show toolbar {i}": f"Werkzeugleiste {i} anzeigen" for i in range(40)}
    ui["Cannot open file number 5"] = "Datei 5 lässt sich nicht öffnen"  # also in alpha.mo: held out everywhere
    write_mo(locale / "de" / "LC_MESSAGES" / "gtk20.mo", ui)
    default = gettext_corpus("de", locale, min_pairs=10, valid_fraction=0.1, test_fraction=0.1)
    held = gettext_corpus(
        "de", locale, min_pairs=10, valid_fraction=0.1, test_fraction=0.1, heldout_catalogs=["desktop"]
    )
    assert set(held["test"]["source"]) == set(ui)  # the whole catalog, and nothing else
    assert not set(ui) & (set(held["train"]["source"]) | set(held["validation"]["source"]))
    for split in ("train", "validation"):  # the other catalogs' hash splits, minus the held-out sources
        assert set(held[split]["source"]) == set(default[split]["source"]) - set(ui)
    with pytest.raises(
        ValueError, match=r"Held-out catalog 'nope' not found; available: \['alpha', 'beta', 'gtk20'\]"
    ):
        gettext_corpus("de", locale, min_pairs=10, heldout_catalogs=["nope"])
    with pytest.raises(ValueError, match="'desktop' not found .no member of the set is installed"):
        gettext_corpus("de", _tiny_locale(tmp_path / "other"), min_pairs=10, heldout_catalogs=["desktop"])
    loaded = load_parallel_data(DataArguments(gettext_locale_dir=str(locale), gettext_min_pairs=10,
                                              gettext_heldout_catalogs=["gtk20"]))  # fmt: skip
    assert set(loaded["test"]["source"]) == set(ui)


def test_gettext_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match=r"No gettext catalogs for language 'xx'.*--train_file"):
        gettext_corpus("xx", tmp_path)
    locale = _tiny_locale(tmp_path, count=5)
    with pytest.raises(ValueError, match=r"Only 6 clean English→de pairs.*at least 1000.*--train_file"):
        gettext_corpus("de", locale)
    with pytest.raises(ValueError, match="--source_lang is 'fr'"):
        load_parallel_data(DataArguments(source_lang="fr", target_lang="de", gettext_locale_dir=str(locale)))


def test_clean_pairs_rules():
    pairs = [("a  b\nc", "x\ty z"), ("a b c", "other"), ("same", "same"), ("abc", "abcdefghijk"), ("é", "ab")]
    assert clean_pairs(pairs) == [("a b c", "x y z")]


def test_clean_pairs_keeps_identical_pairs_only_when_asked_and_after_translations():
    pairs = [("Xbase", "Xbase"), ("Close", "Close"), ("Close", "Schließen"), ("a", "a")]
    assert clean_pairs(pairs) == [("Close", "Schließen")]
    assert clean_pairs(pairs, keep_identical=True) == [("Close", "Schließen"), ("Xbase", "Xbase")]


def test_identical_gettext_pairs_only_ever_train(tmp_path):
    locale = _tiny_locale(tmp_path, count=300)
    names = {f"Model {i} ROM": f"Model {i} ROM" for i in range(200)}
    write_mo(locale / "de" / "LC_MESSAGES" / "gamma.mo", names)
    default = gettext_corpus("de", locale, min_pairs=10, valid_fraction=0.1, test_fraction=0.1)
    copies = gettext_corpus("de", locale, min_pairs=10, valid_fraction=0.1, test_fraction=0.1, keep_identical=True)
    for split in ("validation", "test"):
        assert copies[split][:] == default[split][:]
    added = set(copies["train"]["source"]) - set(default["train"]["source"])
    assert added == {name for name in [*names, "OK"] if split_of(name, 0.1, 0.1) == "train"}
    assert 120 < len(added) < 200
    loaded = load_parallel_data(DataArguments(gettext_locale_dir=str(locale), gettext_min_pairs=10,
                                              gettext_keep_identical=True))  # fmt: skip
    plain = gettext_corpus("de", locale, min_pairs=10)["train"]["source"]
    assert set(loaded["train"]["source"]) - set(plain) == {
        name for name in [*names, "OK"] if split_of(name) == "train"
    }


def test_write_tsv_round_trips(tmp_path):
    dataset = DatasetDict({"train": Dataset.from_dict({"source": ["a b", "c"], "target": ["d", "e\tf"]})})
    paths = write_tsv(dataset, tmp_path, "en", "de")
    back = read_parallel_file(paths["train"], "en", "de")
    assert back["source"] == ["a b", "c"] and back["target"] == ["d", "e f"]


# ---------------------------------------------------------------- tokenization


def test_tokenize_filters_long_pairs_and_keeps_lengths(toy_tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(toy_tokenizer_dir)
    long_source = " ".join(["house"] * 40)
    dataset = Dataset.from_dict(
        {"source": ["the house.", long_source, "the key."], "target": ["die Haus.", "Haus.", "die Schlüssel."]}
    )
    tokenized, dropped = tokenize_parallel(dataset, tokenizer, max_source_length=16, max_target_length=16)
    assert dropped == 1 and len(tokenized) == 2
    row = tokenized[0]
    assert row["source_length"] == len(row["input_ids"]) and row["target_length"] == len(row["labels"])
    assert row["length"] == max(row["source_length"], row["target_length"])
    assert tokenizer.decode(row["labels"], skip_special_tokens=True) == "die Haus."
    with pytest.raises(ValueError, match="Every pair is longer"):
        tokenize_parallel(dataset, tokenizer, max_source_length=2, max_target_length=2)
    with pytest.raises(ValueError, match=r"columns \['source'\] are missing"):
        tokenize_parallel(Dataset.from_dict({"target": ["x"]}), tokenizer, 8, 8)
