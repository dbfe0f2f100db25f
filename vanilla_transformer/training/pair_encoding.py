"""Tokenizing parallel text as a batched `datasets.map` step (paper §5.1): token ids and per-pair lengths, pairs over
the length limits dropped. Used by `prepared` for corpora on disk and by `data.tokenize_parallel` in memory.
"""

from __future__ import annotations

import numpy as np
import pyarrow.compute
from datasets import Dataset, Features, Sequence, Value
from transformers.utils import logging

from .byte_level_bpe import FastByteLevelBpe
from .data import DataArguments

logger = logging.get_logger(__name__)

TOKEN_FEATURES = {
    "input_ids": Sequence(Value("int32")),
    "labels": Sequence(Value("int32")),
    "source_length": Value("int32"),
    "target_length": Value("int32"),
    "length": Value("int32"),  # the longer side, for the Trainer's group_by_length
}
TEXT_FEATURES = {"source": Value("string"), "target": Value("string")}


class PairEncoder:
    """`datasets.map` function: a batch of `source`/`target` texts to token ids and lengths, dropping pairs longer
    than the limits (training only; validation and test are scored complete and keep their text).

    The ids are what `tokenizer(source, text_target=target)` gives. For a fast tokenizer the batch goes straight to
    its Rust backend (a copy without truncation or padding), which skips building a `BatchEncoding` per pair, or,
    for a byte-level BPE tokenizer that tiktoken reproduces, to tiktoken (`byte_level_bpe`); the first batch is
    checked against `tokenizer(...)` and the plain call is used whenever the two differ.
    """

    def __init__(
        self, tokenizer, max_source_length: int | None = None, max_target_length: int | None = None,
        keep_text: bool = False,
    ):  # fmt: skip
        self.tokenizer = tokenizer
        self.max_source_length, self.max_target_length = max_source_length, max_target_length
        self.keep_text = keep_text
        self._backend = self._fast = None
        self._checked = False
        if getattr(tokenizer, "is_fast", False):
            from tokenizers import Tokenizer

            backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
            backend.no_truncation()
            backend.no_padding()
            self._backend = backend
            self._fast = FastByteLevelBpe.from_tokenizer(backend)

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text (with the tokenizer's special tokens, e.g. the final `</s>`)."""
        if self._fast is not None:
            return self._fast.encode(texts)
        encode_batch = getattr(self._backend, "encode_batch_fast", self._backend.encode_batch)
        return [encoding.ids for encoding in encode_batch(texts)]

    def _ids(self, sources: list[str], targets: list[str]) -> tuple[list[list[int]], list[list[int]]]:
        if self._backend is not None and not self._checked:
            self._checked = True
            reference = self.tokenizer(sources[:32], text_target=targets[:32], truncation=False)
            if (self.encode(sources[:32]), self.encode(targets[:32])) != (
                reference["input_ids"],
                reference["labels"],
            ):
                logger.info("The tokenizer's backend differs from its Python call here; tokenizing through the call.")
                self._backend = None
        if self._backend is None:
            encoded = self.tokenizer(sources, text_target=targets, truncation=False)
            return encoded["input_ids"], encoded["labels"]
        return self.encode(sources), self.encode(targets)

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        sources = [text.strip() if text else "" for text in batch["source"]]
        targets = [text.strip() if text else "" for text in batch["target"]]
        texts = [i for i, (s, t) in enumerate(zip(sources, targets, strict=True)) if s and t]
        if len(texts) < len(sources):  # a pair with an empty side is no example
            sources, targets = [sources[i] for i in texts], [targets[i] for i in texts]
        input_ids, labels = self._ids(sources, targets) if sources else ([], [])
        source_lengths = np.fromiter(map(len, input_ids), dtype=np.int32, count=len(input_ids))
        target_lengths = np.fromiter(map(len, labels), dtype=np.int32, count=len(labels))
        keep = np.ones(len(input_ids), dtype=bool)
        if self.max_source_length is not None:
            keep &= source_lengths <= self.max_source_length
        if self.max_target_length is not None:
            keep &= target_lengths <= self.max_target_length
        out = {
            "input_ids": input_ids, "labels": labels, "source_length": source_lengths,
            "target_length": target_lengths, "length": np.maximum(source_lengths, target_lengths),
        }  # fmt: skip
        if self.keep_text:
            out.update(source=sources, target=targets)
        if not keep.all():
            rows = np.flatnonzero(keep)
            out = {
                name: values[rows] if isinstance(values, np.ndarray) else [values[i] for i in rows.tolist()]
                for name, values in out.items()
            }
        return out


def token_features(keep_text: bool) -> Features:
    return Features({**TOKEN_FEATURES, **(TEXT_FEATURES if keep_text else {})})


def tokenize_pairs(
    dataset: Dataset,
    tokenizer,
    max_source_length: int | None,
    max_target_length: int | None,
    num_proc: int | None = None,
    keep_text: bool = False,
    cache_file_name: str | None = None,
    fingerprint: str | None = None,
    desc: str = "Tokenizing pairs",
) -> Dataset:
    """The batched map step: `source`/`target` texts to `input_ids`, `labels` and their lengths (int32), pairs over
    the limits dropped. Written to `cache_file_name` when given (memory-mapped), else kept in memory."""
    missing = {"source", "target"} - set(dataset.column_names)
    if missing:
        raise ValueError(f"Cannot tokenize: columns {sorted(missing)} are missing (found {dataset.column_names}).")
    return dataset.map(
        PairEncoder(tokenizer, max_source_length, max_target_length, keep_text),
        batched=True,
        batch_size=2000,
        writer_batch_size=20_000,  # fewer, larger Arrow record batches: less per-batch metadata held for millions
        num_proc=num_proc if num_proc and num_proc > 1 and len(dataset) >= 2 * num_proc else None,
        remove_columns=dataset.column_names,
        features=token_features(keep_text),
        cache_file_name=cache_file_name,
        new_fingerprint=fingerprint,
        load_from_cache_file=False,
        keep_in_memory=cache_file_name is None,
        desc=desc,
    )


def tokenize_split(
    split: str, dataset: Dataset, tokenizer, args: DataArguments, num_proc: int | None = None,
    cache_file_name: str | None = None, fingerprint: str | None = None,
) -> tuple[Dataset, dict[str, int]]:  # fmt: skip
    """One split tokenized (`tokenize_pairs`) with its counts. Only training pairs are filtered by length;
    validation and test are scored complete, as in the paper, and keep their text."""
    limits = (args.max_source_length, args.max_target_length) if split == "train" else (None, None)
    tokenized = tokenize_pairs(
        dataset, tokenizer, *limits, num_proc=num_proc, keep_text=split != "train", cache_file_name=cache_file_name,
        fingerprint=fingerprint, desc=f"Tokenizing {split} pairs",
    )  # fmt: skip
    if len(tokenized) == 0:
        raise ValueError(
            f"Every {split} pair is longer than max_source_length={args.max_source_length}/"
            f"max_target_length={args.max_target_length}."
        )
    dropped = len(dataset) - len(tokenized)
    if dropped:
        longer = f", or longer than {limits[0]} source / {limits[1]} target tokens" if split == "train" else ""
        logger.warning(f"Dropped {dropped} of {len(dataset)} {split} pairs: an empty side{longer}.")
    lengths = tokenized.with_format("arrow", columns=["source_length", "target_length"])[:]  # views, no copy
    return tokenized, {
        "read": len(dataset), "pairs": len(tokenized), "dropped": dropped,
        "source_tokens": int(pyarrow.compute.sum(lengths.column("source_length")).as_py()),
        "target_tokens": int(pyarrow.compute.sum(lengths.column("target_length")).as_py()),
    }  # fmt: skip
