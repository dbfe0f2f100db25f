"""What a placeholder looks like (docs/localization.md): gettext's format flags, the patterns of format directives,
markup, URLs and escapes that `placeholders` protects, and which patterns an entry's flags ask for. Pure Python.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence

# gettext's format flags (GNU gettext manual, "Special Comments preceding Keywords"); the four with a rule of their
# own below are the ones desktop catalogs use, the others get the common patterns. `no-<x>-format` turns one off.
FORMAT_FLAGS = frozenset(
    f"{name}-format"
    for name in (
        "c", "objc", "cplusplus", "python", "python-brace", "java", "java-printf", "csharp", "javascript", "scheme",
        "lisp", "elisp", "librep", "rust", "go", "ruby", "sh", "awk", "lua", "object-pascal", "smalltalk", "qt",
        "qt-plural", "kde", "kde-kuit", "boost", "tcl", "perl", "perl-brace", "php", "gcc-internal", "gfc-internal",
        "ycp",
    )
)  # fmt: skip
OTHER_FLAGS = frozenset({"fuzzy", "range", "wrap", "no-wrap"})

# printf directives (C99 plus glibc's I flag and gettext's <PRId64> macros), with %1$s positional arguments.
C_FORMAT = (
    r"%(?:(?P<c_pos>\d+)\$)?[-+ #0'I]*(?:\*(?:\d+\$)?|\d+)?(?:\.(?:\*(?:\d+\$)?|\d+))?"
    r"(?:(?:hh|h|ll|l|L|q|j|z|Z|t)?[diouxXeEfFgGaAcCsSpnm]|<PRI[a-zA-Z0-9]+>)|%%"
)
PYTHON_FORMAT = r"%(?:\((?P<py_name>[^()\s]*)\))?[-+ #0]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[hlL]?[diouxXeEfFgGcrsa]|%%"
PYTHON_BRACE_FORMAT = r"\{\{|\}\}|\{(?P<brace_field>[A-Za-z_0-9]*(?:[.\[][^{}\s]*)?)(?:![rsa])?(?::[^{}]*)?\}"
QT_FORMAT = r"%L?(?:[1-9][0-9]?)|%n"
# Without a flag: printf/%-directives with a conversion letter, {0} and {name} fields, %1 (Qt).
COMMON_FORMAT = rf"{C_FORMAT}|%\([A-Za-z_][A-Za-z_0-9]*\)[-+ #0]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa]|{QT_FORMAT}"
COMMON_BRACE = r"\{(?:[0-9]+|[A-Za-z_][A-Za-z_0-9]*)(?::[^{}\s]*)?\}"

MARKUP = (
    r"</?[A-Za-z][A-Za-z0-9:_-]*(?:\s+[A-Za-z_:][-A-Za-z0-9_:.]*(?:\s*=\s*(?:\"[^\"]*\"|'[^']*'|[^\s>]+))?)*\s*/?>"
)
ENTITY = r"&(?:[A-Za-z][A-Za-z0-9]*|#[0-9]+|#x[0-9A-Fa-f]+);"
VOID_ELEMENTS = frozenset(  # HTML elements without an end tag: `<br>`, `<img ...>`
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track", "wbr"}
)
URL = r"(?:https?|ftp|file)://[^\s<>\"']*[^\s<>\"'.,;:!?)\]]"
EMAIL = r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"
ESCAPE = r"\\[\\nrtabfv\"'0-7xu]"  # a literal backslash escape left in the text (polib unescapes the PO syntax)
BREAK = r"[\n\t\r]+"  # newlines and tabs inside a message: the model was trained on folded text


def unknown_flags(flags: Iterable[str]) -> list[str]:
    """Flags that look like a format flag gettext does not know: `foo-format`, or a typo such as `c-fromat`.
    Other flags (fuzzy, range: 0..9, no-wrap, Weblate's max-length:40, ...) are no business of ours."""
    unknown = []
    for flag in flags:
        name = flag.removeprefix("no-")
        if name in FORMAT_FLAGS or flag in OTHER_FLAGS:
            continue
        if name.endswith("-format") or difflib.get_close_matches(name, FORMAT_FLAGS, n=1, cutoff=0.8):
            unknown.append(flag)
    return unknown


def closest_flag(flag: str) -> str | None:
    """The known format flag `flag` is probably a typo of (`c-fromat`: c-format), or None. Closer than what
    `unknown_flags` calls a typo: every `*-format` is about 0.8 alike (`foo-format`, `go-format`)."""
    matches = difflib.get_close_matches(flag.removeprefix("no-"), FORMAT_FLAGS, n=1, cutoff=0.85)
    return matches[0] if matches else None


def format_patterns(flags: Sequence[str]) -> list[tuple[str, str]]:
    """(kind, regex) of the format directives to protect for an entry with these flags."""
    flags = set(flags)
    declared = {flag for flag in flags if flag in FORMAT_FLAGS}
    patterns = []
    if "c-format" in declared or "objc-format" in declared or "gcc-internal-format" in declared:
        patterns.append(("c-format", C_FORMAT))
    if "python-format" in declared:
        patterns.append(("python-format", PYTHON_FORMAT))
    if "python-brace-format" in declared:
        patterns.append(("python-brace-format", PYTHON_BRACE_FORMAT))
    if "qt-format" in declared or "qt-plural-format" in declared or "kde-format" in declared:
        patterns.append(("qt-format", QT_FORMAT))
    if not patterns:  # no rule of our own (or no flag): the common ones, minus what no-<x>-format turns off
        if "no-c-format" not in flags and "no-python-format" not in flags:
            patterns.append(("format", COMMON_FORMAT))
        if "no-python-brace-format" not in flags:
            patterns.append(("format", COMMON_BRACE))
    return patterns
