"""Fixtures for the training-side tests: a synthetic parallel corpus, a .mo writer, a tiny tokenizer."""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# A toy English→German lexicon: sentences are translated word by word, so a tiny model can learn the task.
LEXICON = {
    "the": "die", "red": "rote", "green": "grüne", "small": "kleine", "big": "große", "old": "alte",
    "house": "Haus", "file": "Datei", "window": "Fenster", "key": "Schlüssel", "user": "Benutzer",
    "is": "ist", "was": "war", "open": "offen", "closed": "geschlossen", "missing": "fehlt",
    "not": "nicht", "found": "gefunden", "and": "und", "now": "jetzt",
}  # fmt: skip


def make_pairs(count: int, seed: int = 0, min_words: int = 2, max_words: int = 9) -> list[tuple[str, str]]:
    """Distinct synthetic (English, German) pairs."""
    rng = random.Random(seed)
    words = sorted(LEXICON)
    pairs, seen = [], set()
    while len(pairs) < count:
        sentence = [rng.choice(words) for _ in range(rng.randint(min_words, max_words))]
        english = " ".join(sentence)
        if english in seen:
            continue
        seen.add(english)
        pairs.append((english + ".", " ".join(LEXICON[w] for w in sentence) + "."))
    return pairs


def write_mo(path: Path, messages: dict, charset: str = "UTF-8") -> None:
    """Write a GNU .mo catalog (format in the gettext manual, "The Format of GNU MO Files").

    `messages` maps msgid to msgstr; use "ctx\\x04id" for a context and "one\\x00many" ids/strs for plurals.
    """
    entries = dict(messages)
    entries[""] = f"Content-Type: text/plain; charset={charset}\nPlural-Forms: nplurals=2; plural=(n != 1);\n"
    keys = sorted(entries)
    ids = [key.encode(charset) for key in keys]
    strs = [entries[key].encode(charset) for key in keys]
    count = len(keys)
    originals_offset = 7 * 4
    translations_offset = originals_offset + 8 * count
    data_offset = translations_offset + 8 * count
    tables, blob = [], b""
    for group in (ids, strs):
        table = []
        for text in group:
            table.append((len(text), data_offset + len(blob)))
            blob += text + b"\0"
        tables.append(table)
    header = struct.pack("<7I", 0x950412DE, 0, count, originals_offset, translations_offset, 0, data_offset)
    body = b"".join(struct.pack("<2I", *entry) for table in tables for entry in table)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + body + blob)


@pytest.fixture(scope="session")
def toy_pairs() -> list[tuple[str, str]]:
    return make_pairs(400)


@pytest.fixture(scope="session")
def toy_tokenizer_dir(tmp_path_factory, toy_pairs) -> Path:
    from vanilla_transformer.training.tokenization import train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer([text for pair in toy_pairs for text in pair], vocab_size=400)
    path = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def toy_data_dir(tmp_path_factory, toy_pairs) -> Path:
    """train/valid/test TSV files of the toy corpus."""
    path = tmp_path_factory.mktemp("toy_data")
    splits = {"train": toy_pairs[:320], "valid": toy_pairs[320:360], "test": toy_pairs[360:]}
    for name, pairs in splits.items():
        lines = ["en\tde"] + [f"{en}\t{de}" for en, de in pairs]
        (path / f"{name}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


TINY_OVERRIDES = {  # deliberately unequal sizes so a swapped axis fails loudly
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 3,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 48,
    "decoder_ffn_dim": 40,
    "dropout": 0.0,
}
TINY_OVERRIDES_ARG = ",".join(f"{name}={value}" for name, value in TINY_OVERRIDES.items())


def tiny_model(tokenizer, seed: int = 0):
    import torch

    from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

    torch.manual_seed(seed)
    config = VanillaTransformerConfig.from_preset("tiny", vocab_size=len(tokenizer), **TINY_OVERRIDES)
    return VanillaTransformerForConditionalGeneration(config)


__all__ = ["toy_pairs", "toy_tokenizer_dir", "toy_data_dir"]
