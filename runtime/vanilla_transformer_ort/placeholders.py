"""Placeholders a translation must keep, protected instead of hoped for: mask them before the model, restore and
verify them after, retry what failed and never hand back a broken string (docs/localization.md).

Pure Python, no model: `protected_translation.translate_protected` drives any `translate_batch(list[str]) ->
list[str]` with these functions, so the ONNX runtime, the PyTorch helpers, the HTTP server and the tests (with a
fake) all call the same code.

    protected = protect("Cannot open %s: %s", flags=("c-format",))
    protected.masked                      # 'Cannot open {0}: {1}', what the model sees
    restore("Kann {0} nicht öffnen: {1}", protected)   # 'Kann %s nicht öffnen: %s'
    restore("Kann {0} nicht öffnen", protected)        # None: {1} is missing
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from .placeholder_syntax import BREAK, C_FORMAT, EMAIL, ENTITY, ESCAPE, MARKUP, URL, VOID_ELEMENTS, format_patterns

STYLES = ("brace", "percent", "none")
TOKEN_PATTERNS = {"brace": r"\{(\d+)\}", "percent": r"%(\d+)"}
# What restore accepts back: a model may space a brace token out ("{ 0 }").
OUTPUT_PATTERNS = {"brace": r"\{ ?(\d+) ?\}", "percent": r"%(\d+)"}


def token_text(style: str, index: int) -> str:
    """The mask of the `index`-th placeholder: `{0}` (brace) or `%1` (percent, 1-based like Qt)."""
    return f"{{{index}}}" if style == "brace" else f"%{index + 1}"


@dataclass(frozen=True)
class Span:
    """One protected piece of the source: its text, kind, position, and whether its order is an argument order."""

    text: str
    kind: str
    start: int
    end: int
    is_ordered: bool = False  # a printf/%-directive without a position, or a bare {}: order is meaning


@dataclass(frozen=True)
class Protected:
    """A message made ready for the model: `masked` holds `spans[i]` as the i-th token of `style`."""

    source: str
    masked: str
    spans: tuple[Span, ...]
    style: str
    prefix: str = ""  # leading whitespace, put back verbatim (msgfmt checks leading/trailing newlines)
    suffix: str = ""
    accelerator: str | None = None  # "_" or "&", removed before translation and put back after
    accelerator_letter: str = ""
    flags: tuple[str, ...] = ()

    @property
    def is_translatable(self) -> bool:
        """False when nothing but placeholders, digits and punctuation is left: the source is its own translation."""
        return any(character.isalpha() for character in "".join(self.segments))

    @property
    def segments(self) -> list[str]:
        """The text between the placeholders (as many pieces as placeholders plus one)."""
        if self.style == "none":
            pieces, last = [], 0
            for span in self.spans:
                pieces.append(self.masked[last : span.start])
                last = span.end
            return [*pieces, self.masked[last:]]
        return re.split(TOKEN_PATTERNS[self.style], self.masked)[::2]


def find_spans(text: str, flags: Sequence[str] = (), style: str = "brace") -> list[Span]:
    """Every protected piece of `text`, leftmost first, longest at a position; pieces never overlap."""
    kinds = [
        ("url", URL),
        ("email", EMAIL),
        *format_patterns(flags),
        ("markup", MARKUP),
        ("entity", ENTITY),
        ("escape", ESCAPE),
        ("break", BREAK),
    ]
    if style in TOKEN_PATTERNS:  # text that looks like our own tokens is protected too, so tokens stay unique
        kinds.append(("literal", TOKEN_PATTERNS[style]))
    spans: list[Span] = []
    taken = [False] * len(text)
    for kind, pattern in kinds:
        for match in re.finditer(pattern, text):
            start, end = match.span()
            if start == end or any(taken[start:end]):
                continue
            spans.append(Span(match.group(), kind, start, end, is_ordered_directive(match.group(), kind)))
            taken[start:end] = [True] * (end - start)
    return sorted(spans, key=lambda span: span.start)


def is_ordered_directive(text: str, kind: str) -> bool:
    """True for an argument taken in order: %s, %d (not %1$s, %(name)s, %%), and a bare {} field."""
    if kind in ("c-format", "python-format", "format") and text.startswith("%") and text != "%%":
        return not re.match(r"%\d+\$|%\(|%L?\d|%n$", text)
    return kind in ("python-brace-format",) and text == "{}"


def find_accelerator(text: str, spans: Sequence[Span]) -> tuple[str | None, int]:
    """("_" or "&", index of the marker) when `text` has exactly one menu accelerator outside the spans."""
    inside = set()
    for span in spans:
        inside.update(range(span.start, span.end))
    candidates = []
    for match in re.finditer(r"[_&](?=[^\W_])", text):
        position = match.start()
        if position in inside or (position > 0 and text[position - 1] in "%{&_"):
            continue
        word_start = re.search(r"\w*$", text[:position]).start()
        # At a word start (_Open, &File), or before a small letter inside a capitalised word (E_xit); not in
        # file_name or BUS_NAME.
        if position == word_start or (text[word_start].isupper() and text[position + 1].islower()):
            candidates.append(position)
    if len(candidates) != 1 or "__" in text:
        return None, -1
    return text[candidates[0]], candidates[0]


def protect(text: str, flags: Sequence[str] = (), style: str = "brace") -> Protected:
    """Mask the placeholders of `text` for the model.

    Args:
        text: the source message (unescaped, as polib gives it).
        flags: the entry's flags (`c-format`, `python-brace-format`, ...); none: the common directives.
        style: the mask: "brace" ({0}, {1}, ...), "percent" (%1, %2, ...) or "none" (keep the placeholders as they
            are and only verify them after translation).
    Returns:
        a `Protected`: `masked` goes to the model, `restore(translation, protected)` maps its output back.
    """
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")
    core = text.strip()
    prefix = text[: len(text) - len(text.lstrip())]
    suffix = text[len(text.rstrip()) :] if core else ""
    spans = find_spans(core, flags, style)
    accelerator, position = find_accelerator(core, spans)
    letter = ""
    if accelerator is not None:
        letter = core[position + 1]
        core = core[:position] + core[position + 1 :]
        spans = [
            Span(s.text, s.kind, s.start - (s.start > position), s.end - (s.start > position), s.is_ordered)
            for s in spans
        ]
    pieces, last = [], 0
    for index, span in enumerate(spans):
        pieces.append(core[last : span.start])
        pieces.append(span.text if style == "none" else token_text(style, index))
        last = span.end
    pieces.append(core[last:])
    masked = "".join(pieces)
    return Protected(text, masked, tuple(spans), style, prefix, suffix, accelerator, letter, tuple(flags))


def restore(translation: str, protected: Protected) -> str | None:
    """The translation with the placeholders put back, or None when one is missing, duplicated or invented.

    Non-positional printf directives (%s, %d) that the model reordered become positional (%2$d ... %1$s) under
    c-format, which gettext and glibc accept; elsewhere a reordering is a failure, since the argument order is fixed.
    """
    text = translation.strip()
    spans = protected.spans
    if protected.style == "none":
        restored = text
        order = order_of_verbatim(text, protected)
        if order is None:
            return None
    else:
        found = [(m.start(), m.end(), int(m.group(1))) for m in re.finditer(OUTPUT_PATTERNS[protected.style], text)]
        offset = 0 if protected.style == "brace" else 1
        indices = [index - offset for _, _, index in found]
        if sorted(indices) != list(range(len(spans))):
            return None  # missing, duplicated or invented
        order = indices
        pieces, last = [], 0
        for (start, end, _), index in zip(found, indices, strict=True):
            pieces.append(text[last:start])
            pieces.append(spans[index].text)
            last = end
        pieces.append(text[last:])
        restored = "".join(pieces)
    ordered = [index for index in order if spans[index].is_ordered]
    if ordered != sorted(ordered):
        restored = make_positional(restored, protected, order)
        if restored is None:
            return None
    if protected.accelerator:
        restored = place_accelerator(restored, protected)
        if restored is None:
            return None
    if not restored.strip() and protected.is_translatable:
        return None
    result = protected.prefix + restored + protected.suffix
    if not same_placeholders(protected.source, result, protected.flags):
        return None  # the model wrote a directive of its own (e.g. "50 % der" is "% d")
    if tag_pairing(result, protected.flags) != tag_pairing(protected.source, protected.flags):
        return None  # the tags came back out of order: "</b>…<b>", "<b><i>…</b></i>"
    if has_stray_syntax(result, protected.flags):
        return None
    source = protected.source
    if (result[:1] == "\n") != (source[:1] == "\n") or (result[-1:] == "\n") != (source[-1:] == "\n"):
        return None  # msgfmt: msgid and msgstr must begin and end alike (a break token moved to an edge)
    return result


def tag_pairing(text: str, flags: Sequence[str] = ()) -> tuple[Counter, bool]:
    """The markup of `text` read as nested elements: (the start and end tags that close or open nothing, whether an
    end tag closed an element with another still open inside it, as in `<b><i></b></i>`). A translation must give
    what its source gives: then every element its source opens and closes is closed after it opens, around the
    elements it holds."""
    open_tags: list[tuple[str, str]] = []  # (name, tag) of the elements open, innermost last
    unpaired: Counter = Counter()
    crossed = False
    for span in find_spans(text, flags, "none"):
        name = re.match(r"</?([A-Za-z][A-Za-z0-9:_-]*)", span.text) if span.kind == "markup" else None
        if name is None or span.text.endswith("/>") or name.group(1).lower() in VOID_ELEMENTS:
            continue
        name = name.group(1).lower()
        if not span.text.startswith("</"):
            open_tags.append((name, span.text))
        elif name not in [open_name for open_name, _ in open_tags]:
            unpaired[span.text] += 1
        else:
            while open_tags[-1][0] != name:
                crossed = True
                unpaired[open_tags.pop()[1]] += 1
            open_tags.pop()
    unpaired.update(tag for _, tag in open_tags)
    return unpaired, crossed


def has_stray_syntax(text: str, flags: Sequence[str]) -> bool:
    """A `%` (printf, Python %) or a brace (python-brace-format) outside every placeholder: msgfmt rejects the string
    ("100 %" ends in an incomplete directive) even though no placeholder was lost."""
    rest, last = [], 0
    for span in find_spans(text, flags, "none"):
        rest.append(text[last : span.start])
        last = span.end
    rest.append(text[last:])
    rest = "".join(rest)
    if {"c-format", "python-format", "objc-format", "gcc-internal-format"} & set(flags) and "%" in rest:
        return True
    return "python-brace-format" in flags and ("{" in rest or "}" in rest)


def order_of_verbatim(text: str, protected: Protected) -> list[int] | None:
    """Source indices of the spans in the order `text` holds them (style "none"), or None if the multisets differ."""
    found = find_spans(text, protected.flags, "none")
    if Counter(span.text for span in found) != Counter(span.text for span in protected.spans):
        return None
    seen: Counter = Counter()
    order = []
    for span in found:
        candidates = [i for i, source in enumerate(protected.spans) if source.text == span.text]
        order.append(candidates[seen[span.text]])
        seen[span.text] += 1
    return order


def make_positional(restored: str, protected: Protected, order: Sequence[int]) -> str | None:
    """Rewrite reordered c-format directives as %<n>$<conv> (n = source argument number); None where not allowed."""
    spans = protected.spans
    if "c-format" not in protected.flags or any("*" in s.text for s in spans if s.is_ordered):
        return None
    if any(s.kind == "c-format" and not s.is_ordered and s.text != "%%" for s in spans):
        return None  # positional and plain directives cannot be mixed
    argument = {index: n for n, index in enumerate(i for i, s in enumerate(spans) if s.is_ordered)}
    sequence = [index for index in order if spans[index].is_ordered]  # the directives in the translation's order
    matches = [m for m in re.finditer(C_FORMAT, restored) if m.group() != "%%"]
    if len(matches) != len(sequence):
        return None
    out, last = [], 0
    for match, index in zip(matches, sequence, strict=True):
        out.append(restored[last : match.start()])
        out.append(f"%{argument[index] + 1}${match.group()[1:]}")
        last = match.end()
    out.append(restored[last:])
    return "".join(out)


def place_accelerator(text: str, protected: Protected) -> str | None:
    """Put the accelerator marker back: before the same letter if the translation has it (word starts first),
    else before its first letter; never inside a placeholder."""
    if find_accelerator(text, find_spans(text, protected.flags, "none"))[0] == protected.accelerator:
        return text  # the model wrote one itself
    inside = set()
    for span in protected.spans:
        for match in re.finditer(re.escape(span.text), text):
            inside.update(range(match.start(), match.end()))
    letters = [i for i, c in enumerate(text) if c.isalpha() and i not in inside]
    if not letters:
        return None
    wanted = protected.accelerator_letter.lower()
    same = [i for i in letters if text[i].lower() == wanted]
    word_starts = [i for i in same if i == 0 or not text[i - 1].isalnum()]
    position = (word_starts or same or letters)[0]
    return text[:position] + protected.accelerator + text[position:]


def placeholders(text: str, flags: Sequence[str] = (), accelerator: str | None = None) -> Counter:
    """The multiset of protected pieces of `text` (format directives, markup, entities, URLs, ...) and accelerator
    markers, the measure of "placeholders exactly preserved". The marker is `text`'s own accelerator, or every
    `accelerator` followed by a letter outside the other pieces when it is given (a translation's marker may sit
    where the heuristic of `find_accelerator` would not look)."""
    spans = find_spans(text, flags, "none")
    counter = Counter((span.kind, span.text) for span in spans)
    if accelerator is None:
        accelerator, _ = find_accelerator(text.strip(), find_spans(text.strip(), flags, "none"))
        if accelerator:
            counter[("accelerator", accelerator)] += 1
        return counter
    inside = {i for span in spans for i in range(span.start, span.end)}
    markers = [m.start() for m in re.finditer(rf"{re.escape(accelerator)}(?=[^\W_])", text) if m.start() not in inside]
    if markers:
        counter[("accelerator", accelerator)] += len(markers)
    return counter


def same_placeholders(source: str, translation: str, flags: Sequence[str] = ()) -> bool:
    """True when `translation` holds exactly the placeholders of `source` (positional rewrites %2$d count as %d)."""

    def normal(counter: Counter) -> Counter:
        return Counter({(kind, re.sub(r"^%\d+\$", "%", text)): n for (kind, text), n in counter.items()})

    accelerator, _ = find_accelerator(source.strip(), find_spans(source.strip(), flags, "none"))
    expected = normal(placeholders(source, flags))
    if accelerator:
        return expected == normal(placeholders(translation, flags, accelerator))
    # No accelerator in the source: an underscore the translation has ("Dienst_browser") is text, not a marker.
    found = normal(placeholders(translation, flags))
    return expected == Counter({key: n for key, n in found.items() if key[0] != "accelerator"})
