"""A corpus prepared once on disk: every format read by datasets' builders gives the streaming reader's pairs and the
tokenizer's own ids; a second run reuses the folder, a change prepares it again; bad input and interrupted
preparations lose nothing; the token-budget packing equals the greedy loop it replaced."""

import csv
import errno
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from tests.training_fixtures import *  # noqa: F403 (pytest fixtures)
from tests.training_fixtures import TINY_OVERRIDES_ARG, make_pairs
from vanilla_transformer.training import prepared as prepared_module
from vanilla_transformer.training.data import DataArguments
from vanilla_transformer.training.pair_encoding import PairEncoder
from vanilla_transformer.training.pair_reader import iter_parallel_file
from vanilla_transformer.training.prepared import MANIFEST_FILE, PreparedCorpus, load_corpus, prepare_corpus
from vanilla_transformer.training.token_batches import TokenBudgetBatchSampler, length_columns, pack_token_batches

ROOT = Path(__file__).resolve().parents[1]

# Text that trips parsers: quotes, commas, pandas' NA markers, surrounding spaces, an empty side, a long pair.
TRICKY = [
    ("the red house.", "das rote Haus."),
    ('say "hi", now', 'sag "hallo", jetzt'),
    ("NA", "null"),
    ("  the key  ", " der Schlüssel "),
    ("nan", "N/A"),
    ("", "leer"),
    ("the file is missing.", "die Datei fehlt."),
    (" ".join(["house"] * 30), "Haus."),
]


def _write(folder: Path, pairs, kind: str, compress: bool = False) -> Path:
    """`pairs` as a file (or Moses prefix) of `kind`, optionally gzip-compressed."""
    folder.mkdir(parents=True, exist_ok=True)

    def put(path: Path, text: str) -> Path:
        if compress:
            path = path.with_name(path.name + ".gz")
            with gzip.open(path, "wt", encoding="utf-8") as handle:
                handle.write(text)
        else:
            path.write_text(text, encoding="utf-8")
        return path

    if kind == "tsv":
        return put(folder / "d.tsv", "en\tde\n" + "".join(f"{en}\t{de}\n" for en, de in pairs))
    if kind == "csv":
        path = folder / "plain.csv"
        with path.open("w", encoding="utf-8", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["de", "en"])  # columns in another order than the languages
            writer.writerows([(de, en) for en, de in pairs])
        return put(path, path.read_text(encoding="utf-8")) if compress else path
    if kind == "jsonl":
        lines = "".join(json.dumps({"translation": {"en": en, "de": de}}) + "\n" for en, de in pairs)
        return put(folder / "d.jsonl", lines)
    put(folder / "train.en", "".join(en + "\n" for en, _ in pairs))
    put(folder / "train.de", "".join(de + "\n" for _, de in pairs))
    return folder / "train"


def _ids(corpus: PreparedCorpus, split: str = "train"):
    part = corpus.splits[split]
    return list(zip(part["input_ids"], part["labels"], strict=True))


@pytest.fixture(scope="module")
def tokenizer(toy_tokenizer_dir):
    return AutoTokenizer.from_pretrained(toy_tokenizer_dir)


@pytest.mark.parametrize("kind", ["tsv", "csv", "jsonl", "moses"])
@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gz"])
def test_every_format_gives_the_streaming_readers_pairs_and_the_tokenizers_ids(
    tmp_path, tokenizer, toy_tokenizer_dir, kind, compress
):
    path = _write(tmp_path / "data", TRICKY, kind, compress)
    args = DataArguments(train_file=str(path), tokenizer_name=str(toy_tokenizer_dir), max_source_length=24)
    corpus = prepare_corpus(args, tokenizer, folder=tmp_path / "prepared")
    pairs = list(iter_parallel_file(path, "en", "de"))  # the line-by-line reader is the oracle for the text
    assert ("NA", "null") in pairs and ("the key", "der Schlüssel") in pairs and len(pairs) == len(TRICKY) - 1
    expected = tokenizer([s for s, _ in pairs], text_target=[t for _, t in pairs])  # the tokenizer's own call
    kept = [i for i, ids in enumerate(expected["input_ids"]) if len(ids) <= 24]
    assert len(kept) == len(pairs) - 1  # the 30-word source is over the limit
    assert _ids(corpus) == [(expected["input_ids"][i], expected["labels"][i]) for i in kept]
    stats = corpus.stats["train"]
    assert (stats["read"], stats["pairs"], stats["dropped"]) == (len(TRICKY), len(kept), 2)
    row = corpus.splits["train"][0]
    assert row["source_length"] == len(row["input_ids"]) and row["target_length"] == len(row["labels"])
    assert row["length"] == max(row["source_length"], row["target_length"])


@pytest.mark.parametrize("path", ["tiktoken", "backend"])
def test_backend_fast_path_equals_the_call_with_a_prefix_space_tokenizer(tmp_path, path, monkeypatch):
    from vanilla_transformer.training.tokenization import train_bpe_tokenizer

    if path == "backend":
        monkeypatch.setitem(sys.modules, "tiktoken", None)
    pairs = make_pairs(300, seed=4)
    tokenizer = train_bpe_tokenizer([t for pair in pairs for t in pair], vocab_size=300, add_prefix_space=True)
    encoder = PairEncoder(tokenizer)
    out = encoder({"source": [s for s, _ in pairs], "target": [t for _, t in pairs]})
    assert encoder._backend is not None  # a fast path was taken ...
    assert (encoder._fast is not None) == (path == "tiktoken")
    reference = tokenizer([s for s, _ in pairs], text_target=[t for _, t in pairs])
    assert out["input_ids"] == reference["input_ids"] and out["labels"] == reference["labels"]  # ... and agrees


def test_a_second_run_reuses_the_folder_and_a_change_prepares_it_again(tmp_path, tokenizer, toy_tokenizer_dir, caplog):
    path = _write(tmp_path / "data", make_pairs(120, seed=1), "tsv")
    args = DataArguments(train_file=str(path), tokenizer_name=str(toy_tokenizer_dir))
    folder = tmp_path / "prepared"
    first = prepare_corpus(args, tokenizer, folder=folder)
    fingerprint = json.loads((folder / MANIFEST_FILE).read_text())["fingerprint"]
    caplog.clear()
    again = prepare_corpus(args, tokenizer, folder=folder)
    assert any("Reusing the corpus prepared in" in record.message for record in caplog.records)
    assert _ids(again) == _ids(first)
    assert again.splits["train"].cache_files[0]["filename"].startswith(str(folder))  # memory-mapped from the folder

    changes = {
        "file": lambda: path.write_text(path.read_text() + "the key.\tder Schlüssel.\n", encoding="utf-8"),
        "limit": lambda: setattr(args, "max_source_length", 7),
        "samples": lambda: setattr(args, "max_train_samples", 50),
    }
    seen = {fingerprint}
    for name, change in changes.items():
        change()
        corpus = prepare_corpus(args, tokenizer, folder=folder)
        manifest = json.loads((folder / MANIFEST_FILE).read_text())
        assert manifest["fingerprint"] not in seen, name
        seen.add(manifest["fingerprint"])
    assert corpus.stats["train"]["read"] == 50
    other = AutoTokenizer.from_pretrained(toy_tokenizer_dir)
    other.add_tokens(["Schlüsselbund"])
    assert prepared_module.tokenizer_fingerprint(other) != prepared_module.tokenizer_fingerprint(tokenizer)
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".prepared")]  # no staging left behind


def test_a_prepared_folder_alone_trains_with_its_own_tokenizer(tmp_path, toy_data_dir, toy_tokenizer_dir):
    from vanilla_transformer.cli import prepare_data_command, train_command

    folder = prepare_data_command([
        "--train_file", str(toy_data_dir / "train.tsv"), "--test_file", str(toy_data_dir / "test.tsv"),
        "--tokenizer_name", str(toy_tokenizer_dir), "--output", str(tmp_path / "prepared"),
        "--max_source_length", "40", "--max_target_length", "40",
    ])  # fmt: skip
    assert (folder / "tokenizer" / "tokenizer.json").is_file()
    results = train_command([
        "--prepared_data", str(folder), "--preset", "tiny", "--config_overrides", TINY_OVERRIDES_ARG,
        "--output_dir", str(tmp_path / "run"), "--do_train", "--max_steps", "2", "--max_tokens", "256",
        "--report_to", "none", "--use_cpu", "--disable_tqdm", "true", "--save_strategy", "no",
    ])  # fmt: skip
    assert results["train_loss"] > 0
    info = json.loads((tmp_path / "run" / "training_info.json").read_text())
    assert info["training pairs"] == 320
    other = tmp_path / "other-tokenizer"
    tokenizer = AutoTokenizer.from_pretrained(toy_tokenizer_dir)
    tokenizer.add_tokens(["Schlüsselbund"])
    tokenizer.save_pretrained(other)
    with pytest.raises(ValueError, match="another tokenizer"):
        load_corpus(DataArguments(prepared_data=str(folder), tokenizer_name=str(other)), tokenizer)
    with pytest.raises(ValueError, match="not a prepared corpus"):
        PreparedCorpus.open(tmp_path)


def test_a_hub_dataset_saved_locally_takes_the_same_path(tmp_path, tokenizer, toy_pairs):
    """A dataset in the Hub's own layout (parquet files under data/, a `translation` column), loaded offline."""
    from datasets import Dataset

    data = tmp_path / "wmt-like" / "data"
    data.mkdir(parents=True)
    splits = {"train": toy_pairs[:80], "validation": toy_pairs[80:90], "test": toy_pairs[90:100]}
    for split, pairs in splits.items():
        rows = [{"de": de, "en": en} for en, de in pairs]
        Dataset.from_dict({"translation": rows}).to_parquet(str(data / f"{split}-00000-of-00001.parquet"))
    args = DataArguments(dataset_name=str(tmp_path / "wmt-like"), max_source_length=64, max_target_length=64)
    corpus = prepare_corpus(args, tokenizer, folder=tmp_path / "prepared")
    counts = {split: corpus.stats[split]["read"] for split in corpus.splits}
    assert counts == {"train": 80, "validation": 10, "test": 10}
    expected = tokenizer([en for en, _ in splits["test"]], text_target=[de for _, de in splits["test"]])
    assert _ids(corpus, "test") == list(zip(expected["input_ids"], expected["labels"], strict=True))
    assert corpus.splits["test"]["source"] == [en for en, _ in splits["test"]]  # test keeps its text


@pytest.mark.parametrize(
    "name, content, words",
    [
        ("extra.tsv", "en\tde\na\tb\nc\td\te\n", ["extra.tsv:3", "3 tab-separated fields"]),
        ("short.tsv", "en\tde\na\tb\nc\n", ["short.tsv:3", "1 tab-separated fields"]),
        ("latin1.tsv", "en\tde\na\tb\ncaf\xe9\tx\n".encode("latin-1"), ["latin1.tsv:3", "0xe9", "not UTF-8"]),
        ("quote.csv", 'en,de\na,b\n"c,d\n', ["quote.csv:", "unclosed quote"]),
        ("bad.jsonl", '{"en": "a", "de": "b"}\n{"en": "a"\n', ["bad.jsonl:2", "not valid JSON"]),
        ("empty.tsv", "", ["empty.tsv", "expected columns"]),
    ],
)
def test_malformed_input_is_named_by_file_and_line(tmp_path, tokenizer, name, content, words):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ValueError) as error:
        prepare_corpus(DataArguments(train_file=str(path)), tokenizer, folder=tmp_path / "prepared")
    for word in words:
        assert word in str(error.value), str(error.value)
    assert not (tmp_path / "prepared").exists() and not list(tmp_path.glob(".prepared*"))


def test_unparallel_moses_files_and_unknown_formats_are_one_error(tmp_path, tokenizer):
    (tmp_path / "c.en").write_text("a\nb\nc\n")
    (tmp_path / "c.de").write_text("a\nb\n")
    with pytest.raises(ValueError, match=r"not parallel: .*c\.de has 2 lines"):
        prepare_corpus(DataArguments(train_file=str(tmp_path / "c")), tokenizer, folder=tmp_path / "p")
    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    with pytest.raises(ValueError, match=r"unknown format '\.parquet'"):
        prepare_corpus(DataArguments(train_file=str(tmp_path / "d.parquet")), tokenizer, folder=tmp_path / "p")


def test_a_full_disk_is_one_line_and_leaves_nothing(tmp_path, tokenizer, monkeypatch):
    path = _write(tmp_path / "data", make_pairs(50, seed=2), "tsv")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(prepared_module, "tokenize_split", full)
    with pytest.raises(ValueError, match="no space left on the disk of .* --prepared_data a folder on another disk"):
        prepare_corpus(DataArguments(train_file=str(path)), tokenizer, folder=tmp_path / "prepared")
    assert not (tmp_path / "prepared").exists() and not list(tmp_path.glob(".prepared*"))


def test_a_killed_preparation_is_never_trusted_and_is_cleaned_up(tmp_path, tokenizer, toy_tokenizer_dir):
    """kill -9 while the corpus is being tokenized: the final folder does not exist, the next run prepares it whole
    and removes the dead run's staging folder."""
    path = _write(tmp_path / "data", make_pairs(2000, seed=3, max_words=12) * 40, "tsv")
    folder = tmp_path / "prepared"
    script = (
        "import sys; from transformers import AutoTokenizer\n"
        "from vanilla_transformer.training.data import DataArguments\n"
        "from vanilla_transformer.training.prepared import prepare_corpus\n"
        f"prepare_corpus(DataArguments(train_file={str(path)!r}), AutoTokenizer.from_pretrained("
        f"{str(toy_tokenizer_dir)!r}), folder={str(folder)!r})\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen([sys.executable, "-c", script], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until the text is read and tokenizing has begun
        staging = list(tmp_path.glob(".prepared.preparing-*"))
        if staging and list(staging[0].glob("raw/**/*.arrow")):
            break
        time.sleep(0.05)
    else:
        process.kill()
        pytest.fail(f"the preparation never started writing: {process.communicate()[1][-2000:]}")
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not folder.exists() and staging[0].exists()  # half-written, and under a name nothing reads
    with pytest.raises(ValueError, match="not a prepared corpus"):
        PreparedCorpus.open(folder)
    corpus = prepare_corpus(DataArguments(train_file=str(path)), tokenizer, folder=folder)
    assert corpus.stats["train"]["read"] == 80000 and not staging[0].exists()


# ---------------------------------------------------------------- batching over millions of pairs


def _greedy_loop(order, source, target, max_tokens, max_sentences=None):
    """The per-pair loop the numpy packing replaced, as the oracle."""
    batches, batch, longest = [], [], 0
    for index in order:
        length = max(source[index], target[index])
        full = max_sentences is not None and len(batch) >= max_sentences
        if batch and (full or (len(batch) + 1) * max(longest, length) > max_tokens):
            batches.append(batch)
            batch, longest = [], 0
        batch.append(index)
        longest = max(longest, length)
    batches.append(batch)
    return batches


def test_numpy_packing_equals_the_greedy_loop():
    rng = np.random.default_rng(7)
    for trial in range(40):
        count = int(rng.integers(1, 2500))
        source, target = rng.integers(1, 80, count), rng.integers(1, 90, count)
        max_tokens = int(rng.integers(90, 3000))
        max_sentences = None if trial % 3 else int(rng.integers(1, 50))
        order = rng.permutation(count)
        bounds = pack_token_batches(np.maximum(source, target)[order], max_tokens, max_sentences)
        packed = [order[bounds[i] : bounds[i + 1]].tolist() for i in range(len(bounds) - 1)]
        assert packed == _greedy_loop(order.tolist(), source, target, max_tokens, max_sentences), trial


def test_lengths_come_from_arrow_and_batches_shard_evenly(tmp_path, tokenizer):
    path = _write(tmp_path / "data", make_pairs(300, seed=5), "tsv")
    corpus = prepare_corpus(DataArguments(train_file=str(path)), tokenizer, folder=tmp_path / "prepared")
    source, target = length_columns(corpus.splits["train"])
    assert source.to_pylist() == [len(ids) for ids in corpus.splits["train"]["input_ids"]]
    assert target.to_pylist() == [len(ids) for ids in corpus.splits["train"]["labels"]]
    samplers = [TokenBudgetBatchSampler(source, target, 96, num_replicas=3, rank=r, seed=1) for r in range(3)]
    steps = [list(sampler) for sampler in samplers]
    assert len({len(s) for s in steps}) == 1 and len(steps[0]) == len(samplers[0])  # every rank the same steps
    again = TokenBudgetBatchSampler(source, target, 96, num_replicas=3, rank=1, seed=1)
    assert list(again) == steps[1]  # deterministic in seed and epoch
