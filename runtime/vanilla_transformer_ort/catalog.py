"""Machine pre-translation of gettext catalogs: read .pot/.po/.mo with polib, fill the untranslated entries (plural
forms included) through `protected_translation.translate_protected`, mark them fuzzy, write a .po atomically.

Torch-free: the translation itself is any `translate_batch(list[str]) -> list[str]` (see po_cli.py).
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

from .placeholders import unknown_flags
from .protected_translation import DEFAULT_RETRY, DEFAULT_STYLE, Result, translate_protected

GENERATOR = "vt-translate-po 0.1.0 (vanilla-transformer)"
MO_MAGIC = (b"\xde\x12\x04\x95", b"\x95\x04\x12\xde")

# Plural-Forms of common languages (GNU gettext manual, "Plural forms"; the CLDR rules as gettext writes them).
PLURAL_FORMS = {
    "ja": "nplurals=1; plural=0;", "ko": "nplurals=1; plural=0;", "zh": "nplurals=1; plural=0;",
    "vi": "nplurals=1; plural=0;", "th": "nplurals=1; plural=0;", "id": "nplurals=1; plural=0;",
    "tr": "nplurals=2; plural=(n != 1);",
    "de": "nplurals=2; plural=(n != 1);", "en": "nplurals=2; plural=(n != 1);", "nl": "nplurals=2; plural=(n != 1);",
    "sv": "nplurals=2; plural=(n != 1);", "da": "nplurals=2; plural=(n != 1);", "nb": "nplurals=2; plural=(n != 1);",
    "nn": "nplurals=2; plural=(n != 1);", "no": "nplurals=2; plural=(n != 1);", "fi": "nplurals=2; plural=(n != 1);",
    "et": "nplurals=2; plural=(n != 1);", "el": "nplurals=2; plural=(n != 1);", "hu": "nplurals=2; plural=(n != 1);",
    "it": "nplurals=2; plural=(n != 1);", "es": "nplurals=2; plural=(n != 1);", "ca": "nplurals=2; plural=(n != 1);",
    "eu": "nplurals=2; plural=(n != 1);", "gl": "nplurals=2; plural=(n != 1);", "bg": "nplurals=2; plural=(n != 1);",
    "he": "nplurals=2; plural=(n != 1);", "eo": "nplurals=2; plural=(n != 1);", "pt": "nplurals=2; plural=(n != 1);",
    "fr": "nplurals=2; plural=(n > 1);", "pt_BR": "nplurals=2; plural=(n > 1);", "oc": "nplurals=2; plural=(n > 1);",
    "ru": "nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n%10>=2 && n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2);",
    "uk": "nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n%10>=2 && n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2);",
    "be": "nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n%10>=2 && n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2);",
    "sr": "nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n%10>=2 && n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2);",
    "hr": "nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n%10>=2 && n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2);",
    "pl": "nplurals=3; plural=(n==1 ? 0 : n%10>=2 && n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2);",
    "cs": "nplurals=3; plural=(n==1) ? 0 : (n>=2 && n<=4) ? 1 : 2;",
    "sk": "nplurals=3; plural=(n==1) ? 0 : (n>=2 && n<=4) ? 1 : 2;",
    "lt": "nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n%10>=2 && (n%100<10 || n%100>=20) ? 1 : 2);",
    "lv": "nplurals=3; plural=(n%10==1 && n%100!=11 ? 0 : n != 0 ? 1 : 2);",
    "ro": "nplurals=3; plural=(n==1 ? 0 : (n==0 || (n%100 > 0 && n%100 < 20)) ? 1 : 2);",
    "sl": "nplurals=4; plural=(n%100==1 ? 0 : n%100==2 ? 1 : n%100==3 || n%100==4 ? 2 : 3);",
    "ga": "nplurals=5; plural=(n==1 ? 0 : n==2 ? 1 : n<7 ? 2 : n<11 ? 3 : 4);",
    "ar": "nplurals=6; plural=(n==0 ? 0 : n==1 ? 1 : n==2 ? 2 : n%100>=3 && n%100<=10 ? 3 : n%100>=11 ? 4 : 5);",
}  # fmt: skip


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


# -- Plural-Forms -------------------------------------------------------------------------------------------------


def parse_plural_forms(header: str) -> tuple[int, Callable[[int], int]]:
    """`nplurals=N; plural=EXPR;` -> (N, function n -> form index); raises ValueError if it does not parse."""
    match = re.fullmatch(r"\s*nplurals\s*=\s*(\d+)\s*;\s*plural\s*=\s*(.+?)\s*;?\s*", header or "")
    if not match:
        raise ValueError(f"{header!r} is not 'nplurals=N; plural=EXPRESSION;'")
    nplurals, expression = int(match.group(1)), match.group(2)
    if not 1 <= nplurals <= 10:
        raise ValueError(f"nplurals={nplurals} is out of range (1 to 10)")
    evaluate = compile_plural(expression)
    for n in range(200):
        if not 0 <= evaluate(n) < nplurals:
            raise ValueError(f"plural={expression} gives form {evaluate(n)} for n={n}, outside 0..{nplurals - 1}")
    return nplurals, evaluate


def compile_plural(expression: str) -> Callable[[int], int]:
    """A C plural expression (n, integers, ?:, ||, &&, comparisons, + - * / %, !, parentheses) as a function;
    parsed by recursive descent, never eval'd."""
    tokens = re.findall(r"\s*(\d+|n|\|\||&&|==|!=|<=|>=|[-+*/%<>!?:()])", expression)
    if "".join(tokens) != re.sub(r"\s+", "", expression):
        raise ValueError(f"plural={expression} holds characters a plural expression cannot")
    position = 0

    def peek() -> str | None:
        return tokens[position] if position < len(tokens) else None

    def take(expected: str | None = None) -> str:
        nonlocal position
        token = peek()
        if token is None or (expected is not None and token != expected):
            raise ValueError(f"plural={expression}: expected {expected or 'more'} at token {position + 1}")
        position += 1
        return token

    binary = [("||",), ("&&",), ("==", "!="), ("<", ">", "<=", ">="), ("+", "-"), ("*", "/", "%")]
    operations = {
        "||": lambda a, b: int(bool(a) or bool(b)), "&&": lambda a, b: int(bool(a) and bool(b)),
        "==": lambda a, b: int(a == b), "!=": lambda a, b: int(a != b), "<": lambda a, b: int(a < b),
        ">": lambda a, b: int(a > b), "<=": lambda a, b: int(a <= b), ">=": lambda a, b: int(a >= b),
        "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
        "/": lambda a, b: a // b if b else 0, "%": lambda a, b: a % b if b else 0,
    }  # fmt: skip

    def ternary():
        condition = level(0)
        if peek() == "?":
            take("?")
            yes = ternary()
            take(":")
            no = ternary()
            return lambda n: yes(n) if condition(n) else no(n)
        return condition

    def level(depth: int):
        if depth == len(binary):
            return unary()
        left = level(depth + 1)
        while peek() in binary[depth]:
            operator = take()
            right = level(depth + 1)
            left = (lambda f, a, b: lambda n: f(a(n), b(n)))(operations[operator], left, right)
        return left

    def unary():
        token = take()
        if token == "!":
            operand = unary()
            return lambda n: int(not operand(n))
        if token == "(":
            inner = ternary()
            take(")")
            return inner
        if token == "n":
            return lambda n: n
        if token.isdigit():
            value = int(token)
            return lambda n: value
        raise ValueError(f"plural={expression}: unexpected {token!r}")

    function = ternary()
    if position != len(tokens):
        raise ValueError(f"plural={expression}: unexpected {tokens[position]!r}")
    return function


def default_plural_forms(language: str) -> str | None:
    """The Plural-Forms of `language` (de, pt_BR, sr@latin, zh_CN, ...) from the table, or None."""
    base = re.split(r"[@.]", language)[0].replace("-", "_")
    return PLURAL_FORMS.get(base) or PLURAL_FORMS.get(base.split("_")[0])


def singular_forms(nplurals: int, evaluate: Callable[[int], int]) -> set[int]:
    """The form used for n = 1, if no n beyond 0 and 1 uses it: it takes the translation of msgid, the others (and
    that form in languages such as Russian, where 21 uses it too) take that of msgid_plural."""
    if nplurals == 1:
        return set()
    form = evaluate(1)
    return {form} if all(evaluate(n) != form for n in range(2, 200)) else set()


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
            raise CatalogError(
                f"{path}:{entry.linenum}: unknown format flag {unknown[0]!r}; correct it (c-format, python-format, "
                "python-brace-format, qt-format, ...) or remove it"
            )


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

    Every selected entry's texts (msgid, and msgid_plural for plural entries) go through `translate_protected`;
    an entry whose placeholders did not survive every attempt stays untranslated and is listed in the report.
    `protection=False` sends the raw text and writes whatever comes back: the baseline of benchmarks/po_quality.py,
    not for catalogs anyone ships. `progress(done, total)` is called after each chunk of entries.
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


def print_progress(done: int, total: int, stream=sys.stderr) -> None:
    """A one-line progress bar on a terminal (tqdm is not a runtime dependency)."""
    width = 30
    filled = width * done // max(total, 1)
    stream.write(f"\rTranslating [{'#' * filled}{'.' * (width - filled)}] {done}/{total} entries")
    if done >= total:
        stream.write("\n")
    stream.flush()
