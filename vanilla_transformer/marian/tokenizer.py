"""The tokenizer of an exported MarianMT folder (`exporter.save_marian`): the fast tokenizer (`tokenizer.json`)
with a tokenizer_config.json that transformers 4 and 5 and transformers.js read alike, or, for a model imported from
MarianMT, Marian's sentencepiece files unchanged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from vanilla_transformer_ort.marian_tokenizer import MARIAN_TOKENIZER_FILES, is_marian_tokenizer_folder

from ..model.configuration_vanilla_transformer import VanillaTransformerConfig

# The fast tokenizer's class as written in tokenizer_config.json: transformers 5 reads it as `TokenizersBackend`
# (for model_type "marian" too, instead of the sentencepiece MarianTokenizer), transformers.js strips "Fast" and
# builds its base `PreTrainedTokenizer` from tokenizer.json.
FAST_TOKENIZER_CLASS = "PreTrainedTokenizerFast"


def tokenizer_kind(folder: Path) -> str:
    """ "fast" (tokenizer.json), "marian" (Marian's sentencepiece files) or a ValueError."""
    if (folder / "tokenizer.json").is_file() and (folder / "tokenizer_config.json").is_file():
        return "fast"
    if is_marian_tokenizer_folder(folder):
        return "marian"
    raise ValueError(
        f"No tokenizer in {str(folder)!r}: expected tokenizer.json and tokenizer_config.json (or, for a model "
        "imported from MarianMT, Marian's source.spm, target.spm, vocab.json); pass the tokenizer folder."
    )


def special_tokens(tokenizer_file: Path, settings: dict, config: VanillaTransformerConfig) -> dict[str, str]:
    """pad/bos/eos tokens of the tokenizer, checked against (or, where it names none, taken from) the model's ids."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    tokens = {}
    for role in ("pad", "bos", "eos"):
        token_id = getattr(config, f"{role}_token_id")
        token_id = token_id[0] if isinstance(token_id, list) else token_id
        token = settings.get(f"{role}_token")
        token = token.get("content") if isinstance(token, dict) else token
        if token is None:
            if token_id is not None and tokenizer.id_to_token(token_id) is not None:
                tokens[f"{role}_token"] = tokenizer.id_to_token(token_id)
            continue
        if token_id is not None and tokenizer.token_to_id(token) != token_id:
            raise ValueError(
                f"The tokenizer's {role}_token {token!r} has id {tokenizer.token_to_id(token)} but the model's "
                f"{role}_token_id is {token_id}: not the tokenizer this model was trained with."
            )
    return tokens


def prefix_space_setting(tokenizer_file: Path) -> dict[str, bool]:
    """`add_prefix_space` as the tokenizer's own pre-tokenizer sets it, for tokenizer_config.json.

    transformers 4.x's `PreTrainedTokenizerFast` overwrites the pre-tokenizer's `add_prefix_space` with its own
    keyword (default False) unless tokenizer_config.json names it; without this, the transformers that Optimum pins
    would split the first word of every sentence differently from the model's training."""
    pre_tokenizer = json.loads(tokenizer_file.read_text(encoding="utf-8")).get("pre_tokenizer") or {}
    if "add_prefix_space" in pre_tokenizer:
        return {"add_prefix_space": bool(pre_tokenizer["add_prefix_space"])}
    return {}


def write_tokenizer(
    source: Path, kind: str, output: Path, max_positions: int, config: VanillaTransformerConfig
) -> None:
    """The fast tokenizer with `tokenizer_class` = PreTrainedTokenizerFast and model_max_length = the position
    table's rows, or Marian's sentencepiece files unchanged."""
    if kind == "marian":
        for name in (*MARIAN_TOKENIZER_FILES, "special_tokens_map.json"):  # those the folder has
            if (source / name).is_file():
                shutil.copy2(source / name, output / name)
        return
    shutil.copy2(source / "tokenizer.json", output / "tokenizer.json")
    settings = json.loads((source / "tokenizer_config.json").read_text(encoding="utf-8"))
    settings.update(special_tokens(source / "tokenizer.json", settings, config))
    settings["tokenizer_class"] = FAST_TOKENIZER_CLASS
    settings.pop("auto_map", None)  # no remote tokenizer code
    settings.update(prefix_space_setting(source / "tokenizer.json"))
    settings["model_max_length"] = min(int(settings.get("model_max_length") or max_positions), max_positions)
    (output / "tokenizer_config.json").write_text(json.dumps(settings, indent=2, ensure_ascii=False) + "\n")
    if (source / "special_tokens_map.json").is_file():
        shutil.copy2(source / "special_tokens_map.json", output / "special_tokens_map.json")
