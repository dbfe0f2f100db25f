"""The language pair a model folder was trained for, and the check that a command asks it for that pair.

An export folder names its pair in `manifest.json` (`source_lang`, `target_lang`, written by the exporter from the
model's `training_info.json`); a trained model folder names it in `training_info.json`. Folders from elsewhere (a
converted OPUS-MT model, an export of an older version) may name none: then nothing can be checked and the caller's
pair stands. Codes are compared by their primary subtag, so `fr_CA` or `pt-BR` asks a `fr` or `pt` model.

Standard library only: every runtime command uses it.
"""

from __future__ import annotations

import json
from pathlib import Path

# Files that may name a folder's pair, in the order they are read.
LANGUAGE_FILES = ("manifest.json", "training_info.json")


def folder_languages(folder: str | Path) -> tuple[str, str] | None:
    """(source, target) language codes from the folder's manifest.json or training_info.json; None if neither names
    both."""
    for name in LANGUAGE_FILES:
        path = Path(folder) / name
        if not path.is_file():
            continue
        try:
            info = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(info, dict) and info.get("source_lang") and info.get("target_lang"):
            return str(info["source_lang"]), str(info["target_lang"])
    return None


def primary_subtag(code: str) -> str:
    """`de_DE`, `de-AT`, `DE` -> `de`: the language without its region or script."""
    return code.strip().replace("_", "-").split("-")[0].lower()


def check_target_language(folder: str | Path, target: str, asked_by: str = "--target_lang") -> None:
    """Raise ValueError (one line) when the folder names a target language other than `target`; `asked_by` says
    where `target` came from (a flag, or the catalog's Language header)."""
    languages = folder_languages(folder)
    if languages is None or primary_subtag(languages[1]) == primary_subtag(target):
        return
    source, model_target = languages
    raise ValueError(
        f"--model {folder} translates {source}→{model_target}, but {asked_by} asks for {target!r}; pass a model "
        f"that translates into {primary_subtag(target)}"
    )


def check_pair(folder: str | Path, source: str, target: str) -> None:
    """Raise ValueError (one line) when the folder names a pair other than `source`-`target`."""
    languages = folder_languages(folder)
    if languages is None:
        return
    model_source, model_target = languages
    asked = (primary_subtag(source), primary_subtag(target))
    if (primary_subtag(model_source), primary_subtag(model_target)) != asked:
        raise ValueError(
            f"{source}-{target}={folder}: the folder translates {model_source}→{model_target} (its "
            f"{LANGUAGE_FILES[0]}); name the pair it was trained for, {model_source}-{model_target}={folder}"
        )
