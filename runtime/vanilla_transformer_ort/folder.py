"""`ExportFolder`: an export folder read and checked once (manifest, config, generation settings, tokenizer, language
pair and graphs), so that the translator, the session processes, bulk translation, the server and the catalog tool
take one object and a bad folder is refused the same way everywhere, in one line.

Folders converted from Marian carry Marian's sentencepiece tokenizer instead of `tokenizer.json`; they need the
`sentencepiece` package (see `marian_tokenizer.py`).
"""

from __future__ import annotations

import os
from pathlib import Path

from .contract import (
    BEAM_SCORES_FILE,
    CONFIG_FILE,
    DECODER_FILE,
    ENCODER_FILE,
    EXPORT_AGAIN,
    GENERATION_CONFIG_FILE,
    GRAPH_FILES,
    INPLACE_DECODER_FILE,
    MANIFEST_FILE,
    REORDER_FILE,
    TOKENIZER_FILE,
    language_pair,
    read_json_object,
    read_manifest,
)
from .layouts import CTRANSLATE2, OPTIMUM, PYTORCH, VANILLA, check_layout
from .marian_tokenizer import MarianSentencePieceTokenizer, is_marian_tokenizer_folder
from .search import GenerationSettings

# Files every export folder has; the graphs' external weights (`*.onnx.data`) are those its manifest lists.
# Every folder vt-export-onnx has written since the first release holds the two helper graphs.
REQUIRED_FILES = (ENCODER_FILE, DECODER_FILE, REORDER_FILE, BEAM_SCORES_FILE, CONFIG_FILE, MANIFEST_FILE)

# Generation options that change outputs but are not implemented here: refuse them instead of ignoring them.
UNSUPPORTED_GENERATION = {
    "do_sample": False,
    "num_return_sequences": 1,
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "forced_bos_token_id": None,
    "num_beam_groups": 1,
    "diversity_penalty": 0.0,
}

# What `generate()` produces when neither max_new_tokens nor max_length is set anywhere (transformers'
# `_prepare_generated_length`: the default max_length of 20 plus the decoder start token, capped at the model's
# max_position_embeddings).
DEFAULT_MAX_NEW_TOKENS = 20


def generation_settings(config: dict, generation: dict, folder: str | os.PathLike) -> GenerationSettings:
    """Generation defaults from a folder's `generation_config.json` and `config.json` (as dicts), as transformers
    resolves them; `folder` names the folder in errors."""
    for key, default in UNSUPPORTED_GENERATION.items():
        if generation.get(key, default) not in (default, None):
            raise ValueError(f"generation_config.json sets {key}={generation[key]!r}, which this runtime does not do")

    def pick(key: str, fallback=None):
        value = generation.get(key)
        return config.get(key, fallback) if value is None else value

    eos = pick("eos_token_id")
    eos_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    bad_words = generation.get("bad_words_ids") or []
    if any(len(sequence) != 1 for sequence in bad_words):
        raise ValueError(
            f"generation_config.json sets bad_words_ids={bad_words!r}; this runtime bans single tokens only"
        )
    # transformers drops a banned word that is exactly an EOS token (NoBadWordsLogitsProcessor)
    banned = [sequence[0] for sequence in bad_words if sequence[0] not in eos_ids]
    start = pick("decoder_start_token_id", pick("bos_token_id"))
    if start is None:
        raise ValueError(f"{folder}: no decoder_start_token_id in config.json or generation_config.json")
    if generation.get("max_new_tokens"):
        max_new = generation["max_new_tokens"]
    elif generation.get("max_length") is not None:
        max_new = generation["max_length"] - 1  # the decoder start token counts towards max_length
    else:  # transformers' default: 20 new tokens, at most as many positions as the model has
        max_new = min(DEFAULT_MAX_NEW_TOKENS + 1, config.get("max_position_embeddings") or 10**9) - 1
    min_new = generation.get("min_new_tokens") or max(generation.get("min_length", 0) - 1, 0)
    return GenerationSettings(
        decoder_start_token_id=start,
        eos_token_ids=eos_ids,
        pad_token_id=pick("pad_token_id"),
        max_new_tokens=max_new,
        min_new_tokens=min_new,
        num_beams=generation.get("num_beams", 1),
        length_penalty=generation.get("length_penalty", 1.0),
        early_stopping=generation.get("early_stopping", False),
        forced_eos_token_id=generation.get("forced_eos_token_id"),
        banned_token_ids=banned,
        renormalize_logits=bool(generation.get("renormalize_logits", False)),
    )


def read_generation_config(folder: Path) -> dict:
    """The folder's `generation_config.json`, or {} where it has none (every setting then comes from config.json)."""
    return read_json_object(folder / GENERATION_CONFIG_FILE, optional=True)


def settings_from_folder(folder: str | os.PathLike) -> GenerationSettings:
    """Generation defaults from `generation_config.json` and `config.json`, as transformers resolves them."""
    folder = Path(folder)
    return generation_settings(read_json_object(folder / CONFIG_FILE), read_generation_config(folder), folder)


def load_tokenizer(folder: Path):
    """`tokenizer.json` with the `tokenizers` package, or Marian's sentencepiece files (source.spm, target.spm,
    vocab.json); both offer `encode_batch` and `decode_batch`."""
    if (folder / TOKENIZER_FILE).is_file():
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(folder / TOKENIZER_FILE))
    if is_marian_tokenizer_folder(folder):
        return MarianSentencePieceTokenizer(folder)
    raise ValueError(
        f"export folder {folder} has no tokenizer.json (nor Marian's source.spm, target.spm, vocab.json); "
        f"{EXPORT_AGAIN}"
    )


class ExportFolder:
    """A folder written by `vt-export-onnx`, read and checked without loading any graph.

    Args:
        path: the export folder.
    Attributes:
        path: the folder, as a `Path`.
        manifest: `manifest.json` (what was exported: format, dtype, quantization, files, language pair).
        config: `config.json`.
        settings: the generation defaults (`generation_config.json` over `config.json`).
        tokenizer: the source and target tokenizer (`encode_batch`, `decode_batch`).
        languages: (source, target) as the manifest names them, or None.
        graphs: the graph files present (`contract.GRAPH_FILES`: the in-place decoder is missing from folders of
            format version 1).
    Raises:
        ValueError: one line naming the folder and what is wrong with it: missing, of another layout (the standard
            ONNX layout, a PyTorch or CTranslate2 model folder), a missing file, an unreadable JSON file, generation
            settings this runtime does not implement.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.is_dir():
            raise ValueError(f"export folder {self.path} does not exist; pass a folder vt-export-onnx wrote")
        check_layout(self.path, VANILLA, refuse=(OPTIMUM, CTRANSLATE2, PYTORCH))  # names the kind of folder it is
        for name in REQUIRED_FILES:
            self._require(name)
        self.manifest = read_manifest(self.path)
        for name in self.manifest.get("files", {}):  # the graphs' external weights, which onnxruntime reads
            if name.endswith(".onnx.data"):
                self._require(name)
        self.config = read_json_object(self.path / CONFIG_FILE)
        self.settings = generation_settings(self.config, read_generation_config(self.path), self.path)
        self.tokenizer = load_tokenizer(self.path)
        self.languages = language_pair(self.manifest)
        self.graphs = frozenset(name for name in GRAPH_FILES if (self.path / name).is_file())

    @classmethod
    def of(cls, folder: str | os.PathLike | ExportFolder) -> ExportFolder:
        """`folder` itself when it is an `ExportFolder`, else the folder at that path read: the one place a path
        becomes an `ExportFolder` for the translator, the session processes, bulk, the server and the catalog tool."""
        return folder if isinstance(folder, ExportFolder) else cls(folder)

    def _require(self, name: str) -> None:
        if not (self.path / name).is_file():
            raise ValueError(f"export folder {self.path} has no {name}; {EXPORT_AGAIN}")

    def has(self, graph: str) -> bool:
        """Whether the folder holds `graph` (one of `contract.GRAPH_FILES`)."""
        return graph in self.graphs

    @property
    def has_per_row_lengths(self) -> bool:
        """Whether the in-place decoder takes each row's own length (export format 3), as step-level batching needs."""
        return self.has(INPLACE_DECODER_FILE) and self.manifest.get("format_version", 1) >= 3

    @property
    def quantization(self) -> str | None:
        """The manifest's quantization: None, "int8-dynamic-per-row" or "int8-dynamic" (one range per tensor)."""
        return self.manifest.get("quantization")

    def __repr__(self) -> str:
        return f"ExportFolder({str(self.path)!r})"
