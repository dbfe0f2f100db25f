"""What the server sends to the model: a request's text cut into segments, and HTML reduced to its text.

The model was trained on single messages and sentences, so a text is translated segment by segment: lines are kept
as they are (every line break and the blank space around a line comes back unchanged), and a long line is split
after its sentences' final punctuation. With `format=html`, tags, comments, entities and the contents of `<script>`,
`<style>`, `<code>` and `<pre>` are kept verbatim and only the text between them is translated. Both are pure
functions of the input: what a text is cut into never depends on the other texts of a batch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A sentence ends with . ! ? or … (optionally closed by quotes or brackets) followed by space and a capital or digit.
SENTENCE_END = re.compile(r"(?<=[.!?…])[\"'”’)\]]*\s+(?=[\"'“‘(\[]?[A-ZÀ-ÖØ-Þ0-9])")
LINE_BREAK = re.compile(r"(\r\n|\r|\n)")
# Lines at most this long are translated whole: gettext messages of two or three sentences stay one segment.
DEFAULT_SENTENCE_SPLIT_CHARS = 200
# Elements whose contents are never translated.
VERBATIM_ELEMENTS = frozenset({"script", "style", "code", "pre", "kbd", "samp", "var", "textarea"})


@dataclass(frozen=True)
class Piece:
    """A run of a text: `translate` says whether the model sees it; every other piece is copied as it is."""

    text: str
    translate: bool


def _split_sentences(line: str, max_chars: int) -> list[str]:
    """`line` (no line break) -> sentences, each with the spaces that followed it; whole when short enough."""
    if len(line) <= max_chars:
        return [line]
    pieces, start = [], 0
    for match in SENTENCE_END.finditer(line):
        pieces.append(line[start : match.end()])
        start = match.end()
    pieces.append(line[start:])
    return [piece for piece in pieces if piece]


def _with_outer_space(text: str) -> list[Piece]:
    """`text` -> leading space, content, trailing space: only the content is translated."""
    stripped = text.strip()
    if not stripped:
        return [Piece(text, False)] if text else []
    start = text.index(stripped)
    end = start + len(stripped)
    pieces = [Piece(text[:start], False), Piece(stripped, True), Piece(text[end:], False)]
    return [piece for piece in pieces if piece.text]


def split_text(text: str, max_chars: int = DEFAULT_SENTENCE_SPLIT_CHARS) -> list[Piece]:
    """Plain text -> pieces: line breaks and surrounding space kept, lines longer than `max_chars` cut into
    sentences. `"".join(p.text for p in split_text(t)) == t` for every `t`."""
    pieces: list[Piece] = []
    for part in LINE_BREAK.split(text):
        if LINE_BREAK.fullmatch(part):
            pieces.append(Piece(part, False))
            continue
        for sentence in _split_sentences(part, max_chars):
            pieces.extend(_with_outer_space(sentence))
    return pieces


def split_html(html: str, max_chars: int = DEFAULT_SENTENCE_SPLIT_CHARS) -> list[Piece]:
    """HTML -> pieces: the text between tags is translatable (cut like `split_text`); tags, comments, entities,
    declarations and verbatim elements are copied. Malformed HTML never raises: what the parser cannot read as
    markup is treated as text. `"".join(p.text for p in split_html(h)) == h` for every `h`."""
    return _tokenize_html(html, max_chars)


# A tag, comment, declaration, processing instruction or entity, as HTML's tokenizer recognises them (simplified:
# anything `<` followed by a letter, `/`, `!` or `?` up to the next `>` that closes it; quoted `>` inside attribute
# values are skipped).
_MARKUP = re.compile(
    r"<!--.*?(?:-->|$)"  # comment (unterminated: to the end)
    r"|<![^>]*>?"  # declaration or CDATA-ish
    r"|<\?[^>]*>?"  # processing instruction
    r"|</?[A-Za-z][^\s/>]*(?:\s+(?:[^\s\"'>/=]+(?:\s*=\s*(?:\"[^\"]*\"|'[^']*'|[^\s\"'>]+))?)|\s*/)*\s*>"  # tag
    r"|&(?:#[0-9]+|#[xX][0-9A-Fa-f]+|[A-Za-z][A-Za-z0-9]*);",  # entity
    re.DOTALL,
)
_TAG_NAME = re.compile(r"</?([A-Za-z][^\s/>]*)")


def _tokenize_html(html: str, max_chars: int) -> list[Piece]:
    pieces: list[Piece] = []
    verbatim: str | None = None  # the element whose contents are being copied
    text_start = 0

    def flush_text(end: int) -> None:
        if end > text_start:  # noqa: B023 (read when called, in the loop's current state)
            chunk = html[text_start:end]
            pieces.extend([Piece(chunk, False)] if verbatim else split_text(chunk, max_chars))

    for match in _MARKUP.finditer(html):
        token = match.group(0)
        name_match = _TAG_NAME.match(token)
        name = name_match.group(1).lower() if name_match else None
        if verbatim and not (token.startswith("</") and name == verbatim):
            continue  # inside <script> etc.: everything up to its end tag is copied as one run
        flush_text(match.start())
        pieces.append(Piece(token, False))
        if name in VERBATIM_ELEMENTS and not token.startswith("</") and not token.endswith("/>"):
            verbatim = name
        elif verbatim and name == verbatim:
            verbatim = None
        text_start = match.end()
    flush_text(len(html))
    return _merge_entities(pieces)


def _merge_entities(pieces: list[Piece]) -> list[Piece]:
    """Adjacent verbatim pieces are joined (fewer pieces, same text)."""
    merged: list[Piece] = []
    for piece in pieces:
        if merged and not piece.translate and not merged[-1].translate:
            merged[-1] = Piece(merged[-1].text + piece.text, False)
        else:
            merged.append(piece)
    return merged


def split(text: str, text_format: str, max_chars: int = DEFAULT_SENTENCE_SPLIT_CHARS) -> list[Piece]:
    """`split_text` for "text", `split_html` for "html"."""
    if text_format == "html":
        return split_html(text, max_chars)
    if text_format == "text":
        return split_text(text, max_chars)
    raise ValueError(f"format must be 'text' or 'html', got {text_format!r}")


def join(pieces: list[Piece], translations: list[str]) -> str:
    """Put the translations of the translatable pieces, in order, back between the copied ones."""
    outputs = iter(translations)
    text = "".join(next(outputs) if piece.translate else piece.text for piece in pieces)
    if next(outputs, None) is not None:
        raise ValueError("more translations than translatable pieces")
    return text
