"""Marian's tokenizer without transformers: `source.spm` + `target.spm` (sentencepiece) and `vocab.json`.

It reproduces `transformers.MarianTokenizer` (5.24) for the runtime: sentencepiece splits the text into pieces, the
joint `vocab.json` (or `target_vocab.json` for separate vocabularies) maps pieces to ids, unknown pieces become
`<unk>`, and `</s>` ends every source. Its ids are sentencepiece's own piece ids only by coincidence, so the model's
vocabulary is `vocab.json`, not the .spm files. Needs the `sentencepiece` package (an optional dependency, only for
folders converted from Marian).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

MARIAN_TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json", "target_vocab.json", "tokenizer_config.json")
SPIECE_UNDERLINE = "▁"


@dataclass
class Encoding:
    """The part of `tokenizers.Encoding` the runtime reads."""

    ids: list[int]


def _read_json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


class MarianSentencePieceTokenizer:
    """`encode_batch` / `decode_batch` like `tokenizers.Tokenizer`, with `MarianTokenizer`'s ids and text.

    Args:
        folder: a folder written by `MarianTokenizer.save_pretrained` (e.g. a converted OPUS-MT model).
    """

    def __init__(self, folder: str | Path):
        try:
            import sentencepiece
        except ImportError as error:  # pragma: no cover - depends on the environment
            raise ImportError(
                "This folder holds a Marian tokenizer (source.spm, target.spm, vocab.json): pip install sentencepiece"
            ) from error
        folder = Path(folder)
        options = _read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
        self.separate_vocabs = bool(options.get("separate_vocabs", False))
        self.unk_token = str(options.get("unk_token", "<unk>"))
        self.eos_token = str(options.get("eos_token", "</s>"))
        self.pad_token = str(options.get("pad_token", "<pad>"))
        self.source = sentencepiece.SentencePieceProcessor(model_file=str(folder / "source.spm"))
        self.target = sentencepiece.SentencePieceProcessor(model_file=str(folder / "target.spm"))
        self.vocab: dict[str, int] = _read_json(folder / "vocab.json")
        target_vocab = _read_json(folder / "target_vocab.json") if self.separate_vocabs else self.vocab
        self.id_to_piece = {index: piece for piece, index in target_vocab.items()}
        self.unk_id = self.vocab[self.unk_token]
        self.eos_id = self.vocab[self.eos_token]
        # MarianTokenizer decodes with the source model unless the vocabularies are separate.
        self.decoder_spm = self.target if self.separate_vocabs else self.source
        special = {self.unk_token, self.eos_token, self.pad_token}
        special.update(str(t) for t in options.get("additional_special_tokens", None) or ())
        self.special_tokens = special
        self.special_ids = {target_vocab[t] for t in special if t in target_vocab}

    def encode(self, text: str) -> list[int]:
        """Source ids of one text, `</s>` last; a leading `>>xx<<` language code is one token, as in Marian."""
        code = []
        if text.startswith(">>") and (end := text.find("<<")) != -1:
            code, text = [text[: end + 2]], text[end + 2 :]
        pieces = code + self.source.encode(text, out_type=str)
        return [self.vocab.get(piece, self.unk_id) for piece in pieces] + [self.eos_id]

    def encode_batch(self, texts: list[str]) -> list[Encoding]:
        return [Encoding(self.encode(text)) for text in texts]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of target ids; special tokens (`</s>`, `<pad>`, `<unk>`, ...) are dropped when asked."""
        out, pieces = "", []
        for index in ids:
            if skip_special_tokens and index in self.special_ids:
                continue
            piece = self.id_to_piece.get(index) or self.decoder_spm.IdToPiece(index) or self.unk_token
            if piece in self.special_tokens:  # never decoded by sentencepiece
                out += self.decoder_spm.decode_pieces(pieces) + piece + " "
                pieces = []
            else:
                pieces.append(piece)
        out += self.decoder_spm.decode_pieces(pieces)
        return out.replace(SPIECE_UNDERLINE, " ").strip()

    def decode_batch(self, sequences: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(ids, skip_special_tokens) for ids in sequences]


def is_marian_tokenizer_folder(folder: str | Path) -> bool:
    folder = Path(folder)
    return all((folder / name).is_file() for name in ("source.spm", "target.spm", "vocab.json"))
