"""Machine pre-translation of gettext catalogs: read .pot/.po/.mo with polib, fill the untranslated entries (plural
forms included) through `protected_translation.translate_protected`, mark them fuzzy, write a .po atomically.

Torch-free: the translation itself is any `translate_batch(list[str]) -> list[str]` (see cli.py).
"""

from __future__ import annotations

import datetime
import os
import re
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import polib

from ..placeholder_syntax import closest_flag, unknown_flags
from ..protected_translation import DEFAULT_RETRY, DEFAULT_STYLE, Result, translate_protected
from .plural_forms import default_plural_forms, parse_plural_forms, singular_forms

GENERATOR = "vt-translate-po 0.1.0 (vanilla-transformer)"
MO_MAGIC = (b"\xde\x12\x04\x95", b"\x95\x04\x12\xde")


class CatalogError(ValueError):
    """A problem with the input or output the user must fix; its message names the file and what to do."""


@dataclass
class Report:
    """What `pretranslate` did: counts, and the entries left untranslated with their line numbers."""

    entries: int = 0  # translatable entries in the catalog (header and obsolete ones excluded)
    candidates: int = 0  # those selected (untranslated, or all with overwrite)
    translated: int = 0
    retried: int = 0
    copied: int = 0  # nothing but placeholders: the source is its translation
    plurals: int = 0  # plural entries filled (every msgstr[n])
    failed: list[tuple[int, str, str]] = field(default_factory=list)  # (line, msgid, reason)


# -- reading and writing ------------------------------------------------------------------------------------------


def load_catalog(path: str | os.PathLike) -> polib.POFile | polib.MOFile:
    """A .po/.pot (or a compiled .mo) as polib reads it; problems raise `CatalogError` naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise CatalogError(f"{path}: no such file; pass an existing .po, .pot or .mo catalog")
    head = path.read_bytes()[:4]
    is_mo = head in MO_MAGIC
    if path.suffix == ".mo" or is_mo:
        if not is_mo:
            raise CatalogError(f"{path}: not a compiled gettext catalog (.mo); pass the .po or .pot source")
        if path.suffix != ".mo":
            raise CatalogError(f"{path}: this is a compiled .mo catalog named {path.suffix}; rename it to .mo")
        try:
            return polib.mofile(str(path))
        except (OSError, ValueError, UnicodeDecodeError) as error:
            raise CatalogError(f"{path}: cannot read the .mo catalog ({error}); recompile it with msgfmt") from None
    try:
        catalog = polib.pofile(str(path), wrapwidth=79)
    except UnicodeDecodeError as error:
        raise CatalogError(
            f"{path}: not UTF-8 text at byte {error.start} (a binary file, or another charset: convert it with "
            "msgconv --to-code=UTF-8)"
        ) from None
    except OSError as error:
        line = re.search(r"\(line (\d+)\)", str(error))
        reason = str(error).split("):", 1)[1].strip() if "):" in str(error) else "syntax error"
        where = f"{path}:{line.group(1)}" if line else str(path)
        raise CatalogError(f"{where}: {reason}; fix the catalog (msgfmt --check {path} shows the details)") from None
    return catalog


def translatable_entries(catalog) -> list[polib.POEntry]:
    """Entries with a msgid, not obsolete (the header is not in polib's entry list)."""
    return [entry for entry in catalog if entry.msgid and not entry.obsolete]


def is_untranslated(entry) -> bool:
    """No msgstr (or no msgstr[n]) written yet; a fuzzy entry with a translation counts as translated."""
    if entry.msgid_plural:
        return not any(entry.msgstr_plural.values())
    return not entry.msgstr


def check_output_path(input_path: Path, output_path: Path, in_place: bool) -> None:
    """The output must be a .po in an existing folder, and the input itself only with in_place."""
    if output_path.suffix == ".mo":
        raise CatalogError(f"{output_path}: the output is a .po catalog; give it a .po name (msgfmt compiles it)")
    if not output_path.parent.is_dir():
        raise CatalogError(f"{output_path}: the folder {output_path.parent} does not exist; create it first")
    same = output_path.exists() and output_path.resolve() == input_path.resolve()
    if same and not in_place:
        raise CatalogError(
            f"{output_path}: the output is the input; pass another OUTPUT or --in_place to overwrite the catalog"
        )
    if input_path.suffix == ".mo" and in_place:
        raise CatalogError(f"{input_path}: --in_place cannot write a .mo; pass an OUTPUT .po")


def write_catalog(catalog, output_path: str | os.PathLike) -> None:
    """Save as .po through a temporary file in the same folder, then rename: a failure leaves no partial file."""
    output_path = Path(output_path)
    handle, temporary = tempfile.mkstemp(prefix=f".{output_path.name}.", suffix=".tmp", dir=output_path.parent)
    os.close(handle)
    try:
        if isinstance(catalog, polib.MOFile):
            po = polib.POFile(wrapwidth=79)
            po.metadata = dict(catalog.metadata)
            po.extend(catalog)
            catalog = po
        catalog.save(temporary)
        os.replace(temporary, output_path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


# -- header ---------------------------------------------------------------------------------------------------------


def resolve_plural_forms(catalog, path: Path, language: str, plural_forms: str | None, needed: bool) -> str | None:
    """The Plural-Forms to use: the option, else the header's, else the table's; errors name the file."""
    given = plural_forms or catalog.metadata.get("Plural-Forms", "")
    if "INTEGER" in given or "EXPRESSION" in given:  # the template's placeholder
        given = ""
    source = "--plural_forms" if plural_forms else "its Plural-Forms header"
    if not given:
        given = default_plural_forms(language) or ""
        source = "the default table"
    if not given:
        if needed:
            raise CatalogError(
                f"{path}: no plural rule is known for language {language!r} and the catalog has plural entries; "
                "pass --plural_forms 'nplurals=N; plural=EXPRESSION;'"
            )
        return None
    try:
        parse_plural_forms(given)
    except ValueError as error:
        raise CatalogError(
            f"{path}: {source} does not parse ({error}); fix it or pass --plural_forms 'nplurals=2; plural=(n != 1);'"
        ) from None
    return given


def update_header(catalog, language: str, plural_forms: str | None) -> None:
    """Language, Plural-Forms (when missing), charset UTF-8, PO-Revision-Date and X-Generator, as msginit and
    machine-translation tools set them; the template's fuzzy mark on the header goes."""
    metadata = catalog.metadata
    was_template = any(
        "CHARSET" in value or "INTEGER" in value or value.startswith("YEAR") for value in metadata.values()
    )
    metadata["Language"] = language
    current = metadata.get("Plural-Forms", "")
    if plural_forms and (not current or "INTEGER" in current):
        metadata["Plural-Forms"] = plural_forms
    if "CHARSET" in metadata.get("Content-Type", "CHARSET"):
        metadata["Content-Type"] = "text/plain; charset=UTF-8"
    if metadata.get("Content-Transfer-Encoding", "ENCODING") == "ENCODING":
        metadata["Content-Transfer-Encoding"] = "8bit"
    if "MIME-Version" not in metadata:
        metadata["MIME-Version"] = "1.0"
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M%z")
    metadata["PO-Revision-Date"] = now
    metadata["X-Generator"] = GENERATOR
    if was_template and hasattr(catalog, "metadata_is_fuzzy"):
        catalog.metadata_is_fuzzy = False
    catalog.encoding = "utf-8"


# -- the translate loop ---------------------------------------------------------------------------------------------


def check_flags(catalog, path: Path) -> None:
    """An unknown -format flag means we cannot know what the entry's placeholders are: refuse, naming the line."""
    for entry in translatable_entries(catalog):
        unknown = unknown_flags(entry.flags)
        if unknown:
            guess = closest_flag(unknown[0])
            fix = f"did you mean {guess!r}? Or" if guess else "correct it (c-format, python-format, ...) or"
            raise CatalogError(f"{path}:{entry.linenum}: unknown format flag {unknown[0]!r}; {fix} remove it")


def pretranslate(
    catalog,
    path: str | os.PathLike,
    translate_batch: Callable[[list[str]], list[str]],
    language: str,
    overwrite: bool = False,
    mark_fuzzy: bool = True,
    plural_forms: str | None = None,
    batch_size: int = 32,
    chunk_size: int = 256,
    retry: Sequence[str] = DEFAULT_RETRY,
    style: str = DEFAULT_STYLE,
    protection: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> Report:
    """Fill the catalog's untranslated entries (all with `overwrite`) in place and return a `Report`.

    Every entry written is marked fuzzy, or with `mark_fuzzy=False` written without the mark (a fuzzy entry
    retranslated with `overwrite` loses its mark and msgmerge's notes of the previous msgid).

    Every selected entry's texts (msgid, and msgid_plural for plural entries) go through `translate_protected`;
    an entry whose placeholders did not survive every attempt stays untranslated and is listed in the report.
    `protection=False` sends the raw text and writes whatever comes back: the baseline of
    benchmarks/quality/po_quality.py, not for catalogs anyone ships. `progress(done, total)` is called after each
    chunk of entries.
    """
    path = Path(path)
    check_flags(catalog, path)
    entries = translatable_entries(catalog)
    selected = [entry for entry in entries if overwrite or is_untranslated(entry)]
    has_plurals = any(entry.msgid_plural for entry in selected)
    plural_forms = resolve_plural_forms(catalog, path, language, plural_forms, has_plurals)
    nplurals, singular = 2, {0}
    if plural_forms:
        nplurals, evaluate = parse_plural_forms(plural_forms)
        singular = singular_forms(nplurals, evaluate)
    report = Report(entries=len(entries), candidates=len(selected))
    for start in range(0, len(selected), chunk_size):
        chunk = selected[start : start + chunk_size]
        texts, flags, owners = [], [], []
        for entry in chunk:
            sources = [entry.msgid, entry.msgid_plural] if entry.msgid_plural else [entry.msgid]
            owners.append((len(texts), len(sources)))
            texts.extend(sources)
            flags.extend([tuple(entry.flags)] * len(sources))
        if protection:
            results = translate_protected(translate_batch, texts, flags, retry, style, batch_size)
        else:
            outputs = [
                out for i in range(0, len(texts), batch_size) for out in translate_batch(texts[i : i + batch_size])
            ]
            results = [Result(text, out, "translated", ["raw"]) for text, out in zip(texts, outputs, strict=True)]
        for entry, (first, count) in zip(chunk, owners, strict=True):
            fill_entry(entry, results[first : first + count], nplurals, singular, mark_fuzzy, report)
        if progress:
            progress(min(start + chunk_size, len(selected)), len(selected))
    update_header(catalog, language, plural_forms)
    return report


def fill_entry(entry, results: list[Result], nplurals: int, singular: set[int], mark_fuzzy: bool, report: Report):
    """Write one entry's translation(s), or record why it stays as it was."""
    failed = [result for result in results if result.translation is None]
    if failed:
        report.failed.append((entry.linenum, entry.msgid, failed[0].reason))
        return
    if entry.msgid_plural:
        one, many = results[0].translation, results[1].translation
        entry.msgstr_plural = {n: one if n in singular else many for n in range(nplurals)}
        report.plurals += 1
    else:
        entry.msgstr = results[0].translation
    if all(result.status == "copied" for result in results):
        report.copied += 1
    else:
        report.translated += 1
        report.retried += any(result.status == "retried" for result in results)
    if mark_fuzzy and "fuzzy" not in entry.flags:
        entry.flags.append("fuzzy")
    elif not mark_fuzzy and "fuzzy" in entry.flags:  # the old mark was about the translation just replaced
        entry.flags.remove("fuzzy")
        entry.previous_msgctxt = entry.previous_msgid = entry.previous_msgid_plural = None  # msgmerge's "#|" notes


def print_progress(done: int, total: int, stream=sys.stderr) -> None:
    """A one-line progress bar on a terminal (tqdm is not a runtime dependency)."""
    width = 30
    filled = width * done // max(total, 1)
    stream.write(f"\rTranslating [{'#' * filled}{'.' * (width - filled)}] {done}/{total} entries")
    if done >= total:
        stream.write("\n")
    stream.flush()
