"""The embedded default corpus: English→X pairs harvested from the gettext catalogs installed on the machine
(`/usr/share/locale/<lang>/LC_MESSAGES/*.mo`), real human translations of program messages, cleaned, de-duplicated
and split by a hash of the English side.
"""

from __future__ import annotations

import gettext
import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from transformers.utils import logging

if TYPE_CHECKING:  # imported where used: `--help` of the training commands works without the train extra
    from datasets import DatasetDict

logger = logging.get_logger(__name__)

SPLITS = ("train", "validation", "test")
DEFAULT_LOCALE_DIR = "/usr/share/locale"


def read_mo_catalog(path: str | os.PathLike) -> list[tuple[str, str]]:
    """(msgid, msgstr) pairs of one compiled gettext catalog, without the header, contexts and plural forms."""
    with open(path, "rb") as handle:
        catalog = gettext.GNUTranslations(handle)._catalog
    pairs = []
    for key, value in catalog.items():
        # Plural entries are keyed (msgid, n); context entries are "context\x04msgid"; "" is the header.
        if not isinstance(key, str) or not key or "\x04" in key:
            continue
        pairs.append((key, value))
    return pairs


def fold_whitespace(text: str) -> str:
    """Fold newlines, tabs and runs of spaces into single spaces."""
    return " ".join(text.split())


def clean_pairs(
    pairs: Iterable[tuple[str, str]],
    min_chars: int = 2,
    max_chars: int = 300,
    max_ratio: float = 3.0,
    keep_identical: bool = False,
) -> list[tuple[str, str]]:
    """Fold whitespace; drop sides under `min_chars` or over `max_chars` characters, length ratios outside
    [1/max_ratio, max_ratio] and, unless `keep_identical`, pairs whose sides are identical; keep the first
    translation of each source sentence."""
    folded = [(fold_whitespace(source), fold_whitespace(target)) for source, target in pairs]
    translations = [(source, target) for source, target in folded if source != target]
    identical = [(source, target) for source, target in folded if source == target] if keep_identical else []
    seen: set[str] = set()
    cleaned = []
    for source, target in translations + identical:  # identical pairs last: a translation of the source wins
        if source in seen:
            continue
        if min(len(source), len(target)) < min_chars or max(len(source), len(target)) > max_chars:
            continue
        if not 1.0 / max_ratio <= len(source) / len(target) <= max_ratio:
            continue
        seen.add(source)
        cleaned.append((source, target))
    return cleaned


def split_of(source: str, valid_fraction: float = 0.02, test_fraction: float = 0.02) -> str:
    """Deterministic split of a pair from the sha256 of its source side, so no source sentence is in two splits."""
    bucket = int(hashlib.sha256(source.encode("utf-8")).hexdigest()[:12], 16) / 16**12  # uniform in [0, 1)
    if bucket < test_fraction:
        return "test"
    if bucket < test_fraction + valid_fraction:
        return "validation"
    return "train"


# The desktop stack's user-interface catalogs: menus, dialogs, settings and file types of GUI software. Held out whole
# (`heldout_catalogs="desktop"`), they estimate how the model does on interface text from software it never saw.
DESKTOP_CATALOGS = (
    "PackageKit", "appstream", "at-spi2-core", "avahi", "gdk-pixbuf", "gsettings-desktop-schemas", "gtk20",
    "polkit-1", "shared-mime-info", "software-properties", "xdg-user-dirs",
)  # fmt: skip
HELDOUT_CATALOG_SETS = {"desktop": DESKTOP_CATALOGS}


def harvest_gettext_catalogs(
    target_lang: str, locale_dir: str | os.PathLike = DEFAULT_LOCALE_DIR
) -> list[tuple[str, list[tuple[str, str]]]]:
    """(catalog name, raw pairs) for every `<locale_dir>/<target_lang>/LC_MESSAGES/*.mo`, sorted by file name."""
    messages_dir = Path(locale_dir) / target_lang / "LC_MESSAGES"
    catalogs = sorted(messages_dir.glob("*.mo")) if messages_dir.is_dir() else []
    if not catalogs:
        raise ValueError(
            f"No gettext catalogs for language {target_lang!r}: {messages_dir} has no .mo files. Install the "
            f"language's translations (e.g. Debian `locales-all` plus packages' -l10n), choose another --target_lang, "
            "or point the script at your own data with --train_file/--validation_file or --dataset_name."
        )
    harvested = []
    for catalog in catalogs:
        try:
            harvested.append((catalog.stem, read_mo_catalog(catalog)))
        except (OSError, UnicodeDecodeError, LookupError) as error:
            logger.warning(f"Skipping unreadable catalog {catalog}: {error}")
    total = sum(len(pairs) for _, pairs in harvested)
    logger.info(f"Read {total} messages from {len(catalogs)} catalogs in {messages_dir}.")
    return harvested


def harvest_gettext_pairs(
    target_lang: str, locale_dir: str | os.PathLike = DEFAULT_LOCALE_DIR
) -> list[tuple[str, str]]:
    """Raw English→`target_lang` pairs from every `<locale_dir>/<target_lang>/LC_MESSAGES/*.mo` (sorted by file)."""
    return [pair for _, pairs in harvest_gettext_catalogs(target_lang, locale_dir) for pair in pairs]


def resolve_heldout_catalogs(names: Iterable[str], available: Iterable[str]) -> frozenset[str]:
    """Catalog names (file stems such as `gtk20`) to hold out, with a named set such as `desktop` expanded to its
    members installed here. A named catalog that is not installed, or a set with no member installed, is an error."""
    available = set(available)
    resolved: set[str] = set()
    for name in names:
        members = HELDOUT_CATALOG_SETS.get(name)
        found = set(members or (name,)) & available
        if not found:
            raise ValueError(
                f"Held-out catalog {name!r} not found{' (no member of the set is installed)' if members else ''}; "
                f"available: {sorted(available)}."
            )
        resolved |= found
    return frozenset(resolved)


def gettext_corpus(
    target_lang: str,
    locale_dir: str | os.PathLike = DEFAULT_LOCALE_DIR,
    min_pairs: int = 1000,
    valid_fraction: float = 0.02,
    test_fraction: float = 0.02,
    heldout_catalogs: Iterable[str] = (),
    keep_identical: bool = False,
) -> DatasetDict:
    """The embedded default corpus: cleaned, de-duplicated English→`target_lang` gettext pairs split by hash.

    With `heldout_catalogs` (catalog names, or `"desktop"` for `DESKTOP_CATALOGS`), the test split is instead every
    pair of those catalogs, a whole text domain the model never trains on, and any source sentence they contain is
    kept out of train and validation. Train and validation are the hash splits of the other catalogs, unchanged, and
    the pairs hashed to the usual test split are left out, so that train is the default's train minus those catalogs.

    With `keep_identical`, pairs whose translation equals the source (names, file formats, option syntax that the
    translator kept) are added to the training split, where they teach copying; validation and test stay as they are.
    """
    harvested = harvest_gettext_catalogs(target_lang, locale_dir)
    heldout = resolve_heldout_catalogs(heldout_catalogs, (name for name, _ in harvested))
    pairs = clean_pairs(
        (pair for _, catalog_pairs in harvested for pair in catalog_pairs), keep_identical=keep_identical
    )
    if len(pairs) < min_pairs:
        raise ValueError(
            f"Only {len(pairs)} clean English→{target_lang} pairs were found in the gettext catalogs under "
            f"{locale_dir} (at least {min_pairs} needed). Point the script at other data with "
            "--train_file/--validation_file/--test_file or --dataset_name, or lower --gettext_min_pairs."
        )
    heldout_sources = {
        fold_whitespace(source) for name, catalog_pairs in harvested if name in heldout for source, _ in catalog_pairs
    }
    columns = {split: {"source": [], "target": []} for split in SPLITS}
    for source, target in pairs:
        split = split_of(source, valid_fraction, test_fraction)
        if source == target and (split != "train" or source in heldout_sources):
            continue  # identical pairs only ever train
        if heldout:
            if source in heldout_sources:
                split = "test"
            elif split == "test":
                continue
        columns[split]["source"].append(source)
        columns[split]["target"].append(target)
    for split in SPLITS:
        if not columns[split]["source"]:
            raise ValueError(f"The gettext corpus has no {split} pair ({len(pairs)} pairs in all); add data.")
    logger.info(
        "gettext corpus: "
        + ", ".join(f"{split} {len(columns[split]['source'])}" for split in SPLITS)
        + " pairs"
        + (f" (test: the held-out catalogs {', '.join(sorted(heldout))})." if heldout else ".")
    )
    from datasets import Dataset, DatasetDict

    return DatasetDict({split: Dataset.from_dict(columns[split]) for split in SPLITS})
