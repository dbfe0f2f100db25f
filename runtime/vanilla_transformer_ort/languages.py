"""The language pair a model folder was trained for, and the check that a command asks it for that pair.

An export folder names its pair in `manifest.json` (`source_lang`, `target_lang`, written by the exporter from the
model's `training_info.json`); a trained model folder names it in `training_info.json`. Folders from elsewhere (a
converted OPUS-MT model) may name none: then nothing can be checked and the caller's pair stands. Codes are compared
by their primary subtag, so `fr_CA` or `pt-BR` asks a `fr` or `pt` model.
"""

from __future__ import annotations

import os
from pathlib import Path

from .contract import MANIFEST_FILE, language_pair, read_json_object, read_manifest
from .folder import ExportFolder

TRAINING_INFO_FILE = "training_info.json"  # a trained model folder's record, written by training


def folder_languages(folder: str | os.PathLike | ExportFolder) -> tuple[str, str] | None:
    """(source, target) language codes from the folder's manifest.json (an `ExportFolder` answers from the one it
    read) or training_info.json; None if neither names both."""
    if isinstance(folder, ExportFolder):
        return folder.languages
    for read in (read_manifest, read_training_info):
        try:
            pair = language_pair(read(folder))
        except (OSError, ValueError):  # a damaged file names nothing
            continue
        if pair is not None:
            return pair
    return None


def read_training_info(folder: str | os.PathLike) -> dict:
    """A trained model folder's `training_info.json`, or {} where it has none."""
    return read_json_object(Path(folder) / TRAINING_INFO_FILE, optional=True)


def primary_subtag(code: str) -> str:
    """`de_DE`, `de-AT`, `DE` -> `de`: the language without its region or script (the one normalisation of language
    codes: the pair checks, the server's language names, the plural-forms table)."""
    return code.strip().replace("_", "-").split("-")[0].lower()


def check_target_language(
    folder: str | os.PathLike | ExportFolder, target: str, asked_by: str = "--target_lang"
) -> None:
    """Raise ValueError (one line) when the folder names a target language other than `target`; `asked_by` says
    where `target` came from (a flag, or the catalog's Language header)."""
    languages = folder_languages(folder)
    if languages is None or primary_subtag(languages[1]) == primary_subtag(target):
        return
    source, model_target = languages
    raise ValueError(
        f"--model {_path(folder)} translates {source}→{model_target}, but {asked_by} asks for {target!r}; pass a "
        f"model that translates into {primary_subtag(target)}"
    )


def check_pair(folder: str | os.PathLike | ExportFolder, source: str, target: str) -> None:
    """Raise ValueError (one line) when the folder names a pair other than `source`-`target`."""
    languages = folder_languages(folder)
    if languages is None:
        return
    model_source, model_target = languages
    asked = (primary_subtag(source), primary_subtag(target))
    if (primary_subtag(model_source), primary_subtag(model_target)) != asked:
        folder = _path(folder)
        raise ValueError(
            f"{source}-{target}={folder}: the folder translates {model_source}→{model_target} (its "
            f"{MANIFEST_FILE}); name the pair it was trained for, {model_source}-{model_target}={folder}"
        )


def _path(folder: str | os.PathLike | ExportFolder) -> str | os.PathLike:
    return folder.path if isinstance(folder, ExportFolder) else folder
