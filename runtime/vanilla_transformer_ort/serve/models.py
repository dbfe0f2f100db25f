"""The served language pairs: which export folder translates which pair, checked before the server starts.

A folder names its pair in `manifest.json` (`source_lang`, `target_lang`, written by the exporter from the model's
`training_info.json`), or the command line names it: `en-de=FOLDER`. Language names for `/languages` come from a
small table of ISO 639-1 codes; an unknown code is its own name.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..folder import ExportFolder
from ..languages import check_pair, primary_subtag

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
    """One served pair: source and target language codes and the export folder (`export_folder`: the folder read
    and checked, by `parse_model_spec` or else here)."""

    source: str
    target: str
    folder: Path
    export_folder: ExportFolder | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.export_folder is None:
            object.__setattr__(self, "export_folder", ExportFolder(self.folder))

    @property
    def pair(self) -> str:
        return f"{self.source}-{self.target}"


def batch_dependent(folder: str | os.PathLike | ExportFolder) -> bool:
    """Whether the folder's int8 graphs quantize activations with one range per tensor (manifest quantization
    `int8-dynamic`, onnxruntime's own int8): a text's translation then depends on the rows batched with it."""
    return ExportFolder.of(folder).quantization == "int8-dynamic"


def parse_model_spec(spec: str | os.PathLike) -> ModelSpec:
    """`FOLDER` (languages from its manifest) or `SRC-TGT=FOLDER` -> a checked `ModelSpec`; ValueError otherwise.

    A pair on the command line must be the folder's own when its manifest names one."""
    text = os.fspath(spec)
    match = PAIR_SPEC.match(text)
    export_folder = None
    if match and not Path(text).exists():
        source, target, folder = match["source"], match["target"], Path(match["folder"])
    elif "=" in text and not Path(text).exists():
        name, _, folder_text = text.partition("=")
        raise ValueError(
            f"{text}: {name!r} is not a language pair; write SRC-TGT=FOLDER (for example en-de={folder_text})"
        )
    else:
        folder = Path(text)
        export_folder = ExportFolder(folder)
        if export_folder.languages is None:
            raise ValueError(
                f"{folder}: its manifest.json names no source_lang/target_lang; name the pair on the command line "
                f"as SRC-TGT={folder} (for example en-de={folder})"
            )
        source, target = export_folder.languages
    for code in (source, target):
        if not LANGUAGE_CODE.match(code):
            raise ValueError(f"{text}: {code!r} is not a language code (ISO 639, for example 'en' or 'de')")
    spec = ModelSpec(source, target, folder, export_folder)  # reads the folder where it was not read above
    check_pair(spec.export_folder, source, target)
    return spec


def check_unique(specs: list[ModelSpec]) -> None:
    """Two folders for one pair are refused: which one answers would be arbitrary."""
    seen: dict[str, Path] = {}
    for spec in specs:
        if spec.pair in seen:
            raise ValueError(f"Pair {spec.pair} is served twice ({seen[spec.pair]} and {spec.folder}); keep one")
        seen[spec.pair] = spec.folder


def language_name(code: str) -> str:
    return LANGUAGE_NAMES.get(primary_subtag(code), code)
