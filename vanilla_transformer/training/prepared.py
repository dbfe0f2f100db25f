"""A corpus prepared once: read, tokenized and length-filtered into memory-mapped Arrow files (paper §5.1's data at
any scale).

Corpora of millions of pairs are read by `datasets`' own generator builder into Arrow files on disk, a line at a
time, and tokenized by a batched `map` whose output (token ids, per-pair lengths) is written next to them. The
result is a *prepared folder*, as `fairseq-preprocess` writes one:

    FOLDER/prepared.json              what was prepared from what (written last: its presence marks a complete folder)
    FOLDER/tokenizer/                 the tokenizer the ids belong to
    FOLDER/train-00000-of-00001.arrow the splits' token ids and lengths (validation and test keep their text too)

Every later run, every rank of a distributed run and every resume memory-maps those files in seconds: pages of a
mapped file are shared by all processes and count against no process's own memory. A folder is reused when its
fingerprint (the files' paths, sizes and modification times, or the Hub dataset's name; the tokenizer; the length
and sample limits) matches, and prepared again otherwise. It is written beside its final place and renamed into it,
so a preparation stopped half-way (`kill -9`, a full disk) leaves nothing that a later run trusts.

`PreparedCorpus` is the one reader of that folder; `prepare_corpus` the one writer.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datasets import Dataset, concatenate_datasets
from transformers.utils import logging

from .data import DataArguments, load_parallel_data
from .pair_encoding import tokenize_split
from .pair_files import read_raw_splits
from .pair_reader import pair_file_paths

logger = logging.get_logger(__name__)

MANIFEST_FILE = "prepared.json"
TOKENIZER_FOLDER = "tokenizer"
FORMAT_VERSION = 1  # bump when the folder's content changes meaning: old folders are then prepared again
SPLITS = ("train", "validation", "test")
WAIT_LOG_INTERVAL_S = 60.0


# --------------------------------------------------------------------------------------------------------------------
# The prepared folder
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class PreparedCorpus:
    """The tokenized splits of a corpus, memory-mapped from a prepared folder (or in memory for small corpora that
    were never written, such as the gettext default). `splits[name]` has `input_ids`, `labels`, `source_length`,
    `target_length` and `length`; validation and test also `source` and `target`. `stats[name]` counts the pairs
    read (`read`), kept (`pairs`) and dropped as too long (`dropped`), and the tokens kept."""

    splits: dict[str, Dataset]
    stats: dict[str, dict[str, int]]
    folder: Path | None = None
    manifest: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def open(cls, folder: str | os.PathLike) -> PreparedCorpus:
        """Memory-map a prepared folder. Raises `ValueError` when it is not one (or an incomplete one)."""
        folder = Path(folder)
        manifest = read_manifest(folder)
        if manifest is None:
            raise ValueError(
                f"{folder} is not a prepared corpus (no {MANIFEST_FILE}); write one with vt-prepare-data, or pass "
                "--train_file/--dataset_name to prepare it"
            )
        splits, stats = {}, {}
        for split, entry in manifest["splits"].items():
            files = [folder / name for name in entry["files"]]
            missing = [str(path) for path in files if not path.is_file()]
            if missing:
                raise ValueError(f"{folder} is incomplete: {', '.join(missing)} missing; prepare it again")
            parts = [Dataset.from_file(str(path)) for path in files]
            splits[split] = parts[0] if len(parts) == 1 else concatenate_datasets(parts)
            stats[split] = {key: value for key, value in entry.items() if key != "files"}
        return cls(splits=splits, stats=stats, folder=folder, manifest=manifest)

    def check_compatible(self, args: DataArguments, tokenizer) -> None:
        """A `ValueError` when the run's languages or tokenizer are not the folder's; the run takes the folder's length
        limits (they decided which training pairs it holds)."""
        manifest = self.manifest
        languages = (manifest.get("source_lang"), manifest.get("target_lang"))
        if languages != (args.source_lang, args.target_lang):
            raise ValueError(
                f"{self.folder} holds {languages[0]}→{languages[1]} pairs, but --source_lang/--target_lang ask for "
                f"{args.source_lang}→{args.target_lang}"
            )
        if manifest.get("tokenizer") != tokenizer_fingerprint(tokenizer):
            raise ValueError(
                f"{self.folder} was tokenized by another tokenizer than --tokenizer_name {args.tokenizer_name}; leave "
                f"--tokenizer_name out to use the folder's own ({self.tokenizer_folder}), or prepare the corpus again"
            )
        args.max_source_length = manifest.get("max_source_length", args.max_source_length)
        args.max_target_length = manifest.get("max_target_length", args.max_target_length)

    def example_sources(self, count: int, tokenizer) -> list[str]:
        """Up to `count` source sentences: the test split's (else validation's), else training ones decoded."""
        for split in ("test", "validation", "train"):
            if split in self.splits:
                part = self.splits[split].select(range(min(count, len(self.splits[split]))))
                rows = part.to_dict()
                if "source" in rows:
                    return rows["source"]
                if split == "train":
                    return tokenizer.batch_decode(rows["input_ids"], skip_special_tokens=True)
        return []

    @property
    def tokenizer_folder(self) -> Path | None:
        return self.folder / TOKENIZER_FOLDER if self.folder is not None else None

    def describe(self) -> str:
        """One line: pairs and tokens per split."""
        parts = []
        for split, stat in self.stats.items():
            tokens = stat.get("source_tokens", 0) + stat.get("target_tokens", 0)
            parts.append(f"{split} {stat['pairs']:,} pairs ({tokens:,} tokens)")
        return ", ".join(parts)


def read_manifest(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The folder's manifest, or None if it has none (not a prepared folder, or one whose writing never finished)."""
    path = Path(folder) / MANIFEST_FILE
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return manifest if isinstance(manifest, dict) and "splits" in manifest else None


def default_prepared_folder(fingerprint: str) -> Path:
    """Where `vt-train` keeps a corpus it prepared itself: under `datasets`' cache (HF_DATASETS_CACHE)."""
    from datasets import config

    return Path(config.HF_DATASETS_CACHE) / "vanilla_transformer" / "prepared" / fingerprint[:16]


# --------------------------------------------------------------------------------------------------------------------
# Fingerprints
# --------------------------------------------------------------------------------------------------------------------


def tokenizer_fingerprint(tokenizer) -> str:
    """What decides the ids: the tokenizer's class, its backend pipeline (without truncation and padding settings,
    which a call can change) or, for a slow tokenizer, its vocabulary, and its special tokens."""
    parts: dict[str, Any] = {"class": type(tokenizer).__name__, "special": tokenizer.special_tokens_map}
    if getattr(tokenizer, "is_fast", False):
        backend = json.loads(tokenizer.backend_tokenizer.to_str())
        backend.pop("truncation", None)
        backend.pop("padding", None)
        parts["backend"] = backend
    else:
        parts["vocab"] = sorted(tokenizer.get_vocab().items())
    return _digest(parts)


def file_signature(path: Path) -> dict[str, Any]:
    """A file as `datasets` fingerprints local data files: its path, size and modification time."""
    stat = path.stat()
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def sources_of(args: DataArguments) -> dict[str, Any]:
    """The data the arguments name, as they enter the fingerprint (checked to exist)."""
    if args.train_file or args.validation_file or args.test_file:
        if not args.train_file:
            raise ValueError("--validation_file/--test_file were given without --train_file.")
        files = {"train": args.train_file, "validation": args.validation_file, "test": args.test_file}
        return {
            split: [file_signature(path) for path in pair_file_paths(value, args.source_lang, args.target_lang)]
            for split, value in files.items()
            if value
        }
    if args.dataset_name:
        return {"dataset": args.dataset_name, "config": args.dataset_config_name}
    raise ValueError("no corpus to prepare: pass --train_file (and --validation_file/--test_file) or --dataset_name")


def corpus_fingerprint(args: DataArguments, tokenizer) -> str:
    """Everything the prepared folder depends on; a change in any of it prepares the corpus again."""
    return _digest(
        {
            "format": FORMAT_VERSION,
            "languages": [args.source_lang, args.target_lang],
            "sources": sources_of(args),
            "tokenizer": tokenizer_fingerprint(tokenizer),
            "limits": [args.max_source_length, args.max_target_length],
            "samples": [args.max_train_samples, args.max_eval_samples, args.max_predict_samples],
        }
    )


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


# --------------------------------------------------------------------------------------------------------------------
# Preparing
# --------------------------------------------------------------------------------------------------------------------


def load_corpus(args: DataArguments, tokenizer) -> PreparedCorpus:
    """The tokenized corpus of a training run: files and Hub datasets prepared on disk once (`prepare_corpus`), a
    prepared folder named alone (`--prepared_data`), or the small gettext default tokenized in memory."""
    if is_file_or_hub_corpus(args):
        return prepare_corpus(args, tokenizer, folder=args.prepared_data, num_proc=args.preprocessing_num_workers)
    if args.prepared_data:
        corpus = PreparedCorpus.open(args.prepared_data)
        corpus.check_compatible(args, tokenizer)
        return corpus
    splits, stats = {}, {}
    for split, dataset in load_parallel_data(args).items():
        splits[split], stats[split] = tokenize_split(
            split, dataset, tokenizer, args, num_proc=args.preprocessing_num_workers
        )
    return PreparedCorpus(splits=splits, stats=stats)


def is_file_or_hub_corpus(args: DataArguments) -> bool:
    """Whether the arguments name data that is prepared on disk (files or a Hub dataset), not the in-memory
    gettext default."""
    return bool(args.train_file or args.validation_file or args.test_file or args.dataset_name)


def prepare_corpus(
    args: DataArguments,
    tokenizer,
    folder: str | os.PathLike | None = None,
    num_proc: int | None = None,
) -> PreparedCorpus:
    """The corpus the arguments name, tokenized: memory-mapped from `folder` when it was prepared from the same
    data, tokenizer and limits, else prepared into it first (default: a folder in `datasets`' cache named by the
    fingerprint). Under a distributed launch the first process of each machine prepares and the others wait for
    its folder (by watching the file system, so a long preparation trips no collective timeout) and map it.

    Training pairs longer than `max_source_length`/`max_target_length` tokens are dropped; validation and test
    pairs are kept whole (the paper scores complete test sets).
    """
    fingerprint = corpus_fingerprint(args, tokenizer)
    folder = Path(folder) if folder is not None else default_prepared_folder(fingerprint)
    if _matches(folder, fingerprint):
        corpus = PreparedCorpus.open(folder)
        logger.warning(f"Reusing the corpus prepared in {folder} (same data, tokenizer, limits): {corpus.describe()}")
        return corpus
    if int(os.environ.get("LOCAL_RANK", "0")) != 0:
        _wait_for(folder, fingerprint)
        return PreparedCorpus.open(folder)
    if read_manifest(folder) is not None:
        logger.warning(f"{folder} was prepared from other data, tokenizer or limits; preparing it again.")
    elif folder.exists() and any(folder.iterdir()):
        raise ValueError(f"{folder} exists and is not a prepared corpus; pass an empty or new folder (or remove it)")
    started = time.monotonic()
    _remove_stale_staging(folder)
    staging = folder.with_name(f".{folder.name}.preparing-{socket.gethostname()}-{os.getpid()}")
    try:
        _write_prepared(args, tokenizer, staging, fingerprint, num_proc)
        _replace(staging, folder)
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise ValueError(
                f"no space left on the disk of {folder.parent} while preparing the corpus; free space there or pass "
                "--prepared_data a folder on another disk"
            ) from None
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    corpus = PreparedCorpus.open(folder)
    logger.warning(f"Prepared {corpus.describe()} in {time.monotonic() - started:.0f} s into {folder}")
    return corpus


def _matches(folder: Path, fingerprint: str) -> bool:
    manifest = read_manifest(folder)
    return manifest is not None and manifest.get("fingerprint") == fingerprint


def _wait_for(folder: Path, fingerprint: str) -> None:
    """Block until the first process of this machine has written `folder` (the launcher stops this process if that
    one fails)."""
    started = last_log = time.monotonic()
    while not _matches(folder, fingerprint):
        time.sleep(1.0)
        if time.monotonic() - last_log >= WAIT_LOG_INTERVAL_S:
            last_log = time.monotonic()
            logger.warning(f"Waiting {last_log - started:.0f} s for local rank 0 to prepare the corpus in {folder}")


def _remove_stale_staging(folder: Path) -> None:
    """Remove what a preparation on this machine left when it was killed (its process is gone); such a folder never
    has the final name, so nothing ever read it."""
    prefix = f".{folder.name}.preparing-{socket.gethostname()}-"
    if not folder.parent.is_dir():
        return
    for path in folder.parent.glob(f"{prefix}*"):
        pid = path.name[len(prefix) :]
        if pid.isdigit() and not _process_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _replace(staging: Path, folder: Path) -> None:
    """Move the finished staging folder into place (an old preparation there is removed first)."""
    if folder.exists():
        old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
        folder.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging.rename(folder)


def _write_prepared(args: DataArguments, tokenizer, staging: Path, fingerprint: str, num_proc: int | None) -> None:
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    tokenizer.save_pretrained(staging / TOKENIZER_FOLDER)
    raw = read_raw_splits(args, staging / "raw")
    splits = {}
    for split, dataset in raw.items():
        tokenized, stat = tokenize_split(
            split, dataset, tokenizer, args, num_proc=num_proc, cache_file_name=str(staging / f"{split}.arrow"),
            fingerprint=f"{fingerprint[:32]}-{split}",
        )  # fmt: skip
        splits[split] = {"files": [Path(entry["filename"]).name for entry in tokenized.cache_files], **stat}
        del tokenized
    del raw
    shutil.rmtree(staging / "raw", ignore_errors=True)
    manifest = {
        "format": FORMAT_VERSION, "fingerprint": fingerprint, "source_lang": args.source_lang,
        "target_lang": args.target_lang, "sources": sources_of(args), "tokenizer": tokenizer_fingerprint(tokenizer),
        "max_source_length": args.max_source_length, "max_target_length": args.max_target_length,
        "splits": splits,
    }  # fmt: skip
    (staging / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
