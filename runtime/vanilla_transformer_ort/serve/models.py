"""The served language pairs: which export folder translates which pair, checked before the server starts.

A folder names its pair in `manifest.json` (`source_lang`, `target_lang`, written by the exporter from the model's
`training_info.json`), or the command line names it: `en-de=FOLDER`. Language names for `/languages` come from a
small table of ISO 639-1 codes; an unknown code is its own name.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..contract import CONFIG_FILE, DECODER_FILE, ENCODER_FILE, MANIFEST_FILE, TOKENIZER_FILE
from ..languages import check_pair, folder_languages
from ..layouts import CTRANSLATE2, OPTIMUM, PYTORCH, VANILLA, check_layout
from ..marian_tokenizer import is_marian_tokenizer_folder

LANGUAGE_NAMES = {
    "ar": "Arabic", "bg": "Bulgarian", "ca": "Catalan", "cs": "Czech", "da": "Danish", "de": "German",
    "el": "Greek", "en": "English", "eo": "Esperanto", "es": "Spanish", "et": "Estonian", "eu": "Basque",
    "fa": "Persian", "fi": "Finnish", "fr": "French", "ga": "Irish", "gl": "Galician", "he": "Hebrew",
    "hi": "Hindi", "hr": "Croatian", "hu": "Hungarian", "id": "Indonesian", "it": "Italian", "ja": "Japanese",
    "ko": "Korean", "lt": "Lithuanian", "lv": "Latvian", "ms": "Malay", "nb": "Norwegian Bokmål", "nl": "Dutch",
    "pl": "Polish", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "sk": "Slovak", "sl": "Slovenian",
    "sq": "Albanian", "sr": "Serbian", "sv": "Swedish", "th": "Thai", "tr": "Turkish", "uk": "Ukrainian",
    "vi": "Vietnamese", "zh": "Chinese",
}  # fmt: skip
LANGUAGE_CODE = re.compile(r"^[a-z]{2,3}([_-][A-Za-z0-9]{2,8})*$")
PAIR_SPEC = re.compile(r"^(?P<source>[^=/\\]+?)-(?P<target>[^=/\\]+)=(?P<folder>.+)$")


@dataclass(frozen=True)
class ModelSpec:
    """One served pair: source and target language codes and the export folder."""

    source: str
    target: str
    folder: Path

    @property
    def pair(self) -> str:
        return f"{self.source}-{self.target}"


def check_export_folder(folder: Path) -> None:
    """Raise ValueError naming the folder and the missing file when `folder` is not an ONNX export."""
    if not folder.is_dir():
        raise ValueError(f"{folder}: no such folder; pass an export folder written by vt-export-onnx")
    check_layout(folder, VANILLA, refuse=(OPTIMUM, CTRANSLATE2, PYTORCH))  # names the kind of folder it is
    for name in (ENCODER_FILE, DECODER_FILE, CONFIG_FILE):
        if not (folder / name).is_file():
            raise ValueError(f"{folder} is not an ONNX export: it has no {name}; export it with vt-export-onnx")
    if not (folder / TOKENIZER_FILE).is_file() and not is_marian_tokenizer_folder(folder):
        raise ValueError(f"{folder} is not an ONNX export: it has no {TOKENIZER_FILE}; export it with vt-export-onnx")


def batch_dependent(folder: Path) -> bool:
    """Whether the folder's int8 graphs quantize activations with one range per tensor (manifest quantization
    `int8-dynamic`, the only int8 before per-row ranges): a text's translation then depends on the rows batched with
    it."""
    try:
        manifest = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("quantization") == "int8-dynamic"


def parse_model_spec(spec: str | os.PathLike) -> ModelSpec:
    """`FOLDER` (languages from its manifest) or `SRC-TGT=FOLDER` -> a checked `ModelSpec`; ValueError otherwise.

    A pair on the command line must be the folder's own when its manifest names one."""
    text = os.fspath(spec)
    match = PAIR_SPEC.match(text)
    if match and not Path(text).exists():
        source, target, folder = match["source"], match["target"], Path(match["folder"])
    elif "=" in text and not Path(text).exists():
        name, _, folder_text = text.partition("=")
        raise ValueError(
            f"{text}: {name!r} is not a language pair; write SRC-TGT=FOLDER (for example en-de={folder_text})"
        )
    else:
        folder = Path(text)
        check_export_folder(folder)
        languages = folder_languages(folder)
        if languages is None:
            raise ValueError(
                f"{folder}: its manifest.json names no source_lang/target_lang; name the pair on the command line "
                f"as SRC-TGT={folder} (for example en-de={folder})"
            )
        source, target = languages
    for code in (source, target):
        if not LANGUAGE_CODE.match(code):
            raise ValueError(f"{text}: {code!r} is not a language code (ISO 639, for example 'en' or 'de')")
    check_export_folder(folder)
    check_pair(folder, source, target)
    return ModelSpec(source, target, folder)


def check_unique(specs: list[ModelSpec]) -> None:
    """Two folders for one pair are refused: which one answers would be arbitrary."""
    seen: dict[str, Path] = {}
    for spec in specs:
        if spec.pair in seen:
            raise ValueError(f"Pair {spec.pair} is served twice ({seen[spec.pair]} and {spec.folder}); keep one")
        seen[spec.pair] = spec.folder


def language_name(code: str) -> str:
    return LANGUAGE_NAMES.get(code.split("-")[0].split("_")[0].lower(), code)
