"""What the server sends to the model: a request's text cut into segments, and HTML sentences with their tags.

The model was trained on single messages and sentences, so a text is translated segment by segment: lines are kept
as they are (every line break and the blank space around a line comes back unchanged), and a long line is split
after its sentences' final punctuation. With `format=html`, block-level markup (`<p>`, `<li>`, `<br>`, `<td>`, ...),
comments and the elements whose contents are never translated (`<script>`, `<style>`, `<pre>`, ...) are copied and
end a sentence; inline elements (`<b>`, `<a href=...>`, `<span>`, ...) stay inside it: the model sees the sentence
with its tags, which placeholder protection keeps, and the tags come back around the words the model put them
around. Entities are decoded for the model and encoded again in the answer; an inline element whose contents are
never translated (`<code>`, `<kbd>`, `<samp>`, `<var>`) travels as one tag. Both are pure functions of the input:
what a text is cut into never depends on the other texts of a batch.
"""

from __future__ import annotations

import html as html_lib
import re
import unicodedata
from dataclasses import dataclass

from ..placeholder_syntax import ENTITY, MARKUP, VOID_ELEMENTS

# A sentence ends with . ! ? or … (optionally closed by quotes or brackets) followed by space and a capital or digit.
SENTENCE_END = re.compile(r"(?<=[.!?…])[\"'”’)\]]*\s+(?=[\"'“‘(\[]?[A-ZÀ-ÖØ-Þ0-9])")
LINE_BREAK = re.compile(r"(\r\n|\r|\n)")
# Lines at most this long are translated whole: gettext messages of two or three sentences stay one segment.
DEFAULT_SENTENCE_SPLIT_CHARS = 200
# Elements whose contents are never translated.
VERBATIM_ELEMENTS = frozenset({"script", "style", "code", "pre", "kbd", "samp", "var", "textarea"})
# Elements that flow inside a sentence (HTML's phrasing content); every other element ends one.
INLINE_ELEMENTS = frozenset(
    {"a", "abbr", "b", "bdi", "bdo", "big", "cite", "code", "data", "del", "dfn", "em", "font", "i", "img", "ins",
     "kbd", "mark", "q", "s", "samp", "small", "span", "strike", "strong", "sub", "sup", "time", "tt", "u", "var",
     "wbr"}
)  # fmt: skip
# What an HTML sentence's translation holds as it is: its tags and the entities the model was given undecoded.
_KEPT = re.compile(f"{MARKUP}|{ENTITY}")


@dataclass(frozen=True)
class HtmlSentence:
    """An HTML sentence as the model sees it (`model_text`): its inline tags as they are, its entities decoded
    (except `&lt;`, `&gt;` and invisible characters such as `&nbsp;`, kept as placeholders), each inline element
    whose contents are never translated replaced by a self-closing stand-in tag."""

    model_text: str
    elements: tuple[tuple[str, str], ...] = ()  # (stand-in tag, the element it stands for)
    entities: tuple[tuple[str, str], ...] = ()  # (decoded text, the entity it came from), encoded again on output

    def to_html(self, translation: str) -> str:
        """The translation of `model_text` as HTML: tags and kept entities as they are, stand-ins replaced by their
        elements, the text between them escaped (`&`, `<`, `>`, and the source's entities encoded as it had them)."""
        elements = dict(self.elements)
        out, last = [], 0
        for match in _KEPT.finditer(translation):
            out.append(self._escape(translation[last : match.start()]))
            out.append(elements.get(match.group(), match.group()))
            last = match.end()
        out.append(self._escape(translation[last:]))
        return "".join(out)

    def _escape(self, text: str) -> str:
        text = html_lib.escape(text, quote=False)
        for decoded, entity in self.entities:
            text = text.replace(decoded, entity)
        return text


@dataclass(frozen=True)
class Piece:
    """A run of a text: `translate` says whether the model sees it; every other piece is copied as it is. An HTML
    sentence also carries what the model sees of it and how its translation goes back into the page (`html`)."""

    text: str
    translate: bool
    html: HtmlSentence | None = None

    @property
    def source(self) -> str:
        """What the model translates."""
        return self.html.model_text if self.html else self.text

    def render(self, translation: str) -> str:
        """The translation of `source` as it goes back into the text."""
        return self.html.to_html(translation) if self.html else translation


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
    """HTML -> pieces: each sentence of the text between block-level markup is translatable, its inline tags with
    it (`Piece.html`); lines and long lines are cut like `split_text`; block-level tags, comments, declarations and
    verbatim elements are copied, and so are a sentence's outer spaces and the tags that enclose all of it (`<b>`
    around the whole sentence, an end tag whose start is in another sentence). Malformed HTML never raises: what the
    parser cannot read as markup is treated as text. `"".join(p.text for p in split_html(h)) == h` for every `h`."""
    pieces: list[Piece] = []
    run: list[tuple[str, str]] = []  # the inline content since the last block-level markup
    for kind, text in _html_tokens(html):
        if kind == "markup":
            pieces.extend(_inline_pieces(run, max_chars))
            pieces.append(Piece(text, False))
            run = []
        else:
            run.append((kind, text))
    pieces.extend(_inline_pieces(run, max_chars))
    return _merge_copied(pieces)


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


def _html_tokens(html: str) -> list[tuple[str, str]]:
    """HTML -> (kind, text) tokens whose texts join to it: "text", "entity", "tag" (an inline tag the placeholders
    recognise), "element" (an inline verbatim element, start tag to end tag) and "markup" (everything else)."""
    tokens: list[tuple[str, str]] = []
    verbatim: str | None = None  # the element whose contents are being copied
    start = 0  # where the text not yet in a token starts (inside a verbatim element: where the element starts)
    for match in _MARKUP.finditer(html):
        token = match.group(0)
        name_match = _TAG_NAME.match(token)
        name = name_match.group(1).lower() if name_match else None
        is_end = token.startswith("</")
        if verbatim:
            if is_end and name == verbatim:  # inside <script> etc.: everything up to its end tag is one token
                tokens.append(("element" if verbatim in INLINE_ELEMENTS else "markup", html[start : match.end()]))
                verbatim, start = None, match.end()
            continue
        if match.start() > start:
            tokens.append(("text", html[start : match.start()]))
        start = match.end()
        if name in VERBATIM_ELEMENTS and not is_end and not token.endswith("/>"):
            verbatim, start = name, match.start()
        elif token.startswith("&"):
            tokens.append(("entity", token))
        elif name in INLINE_ELEMENTS and re.fullmatch(MARKUP, token):
            tokens.append(("tag", token))
        else:
            tokens.append(("markup", token))
    if start < len(html):
        tokens.append(("markup" if verbatim else "text", html[start:]))  # an unterminated verbatim element: copied
    return tokens


def _inline_pieces(tokens: list[tuple[str, str]], max_chars: int) -> list[Piece]:
    """Inline content -> pieces: line breaks copied, each line cut into sentences (`_sentences`), each sentence
    with its outer spaces and enclosing tags copied (`_sentence_pieces`)."""
    pieces: list[Piece] = []
    line: list[tuple[str, str]] = []
    for kind, text in [*tokens, ("text", "\n")]:  # a final break flushes the last line (and is not kept)
        parts = LINE_BREAK.split(text) if kind == "text" else [text]
        for part in parts:
            if kind == "text" and LINE_BREAK.fullmatch(part):
                for sentence in _sentences(line, max_chars):
                    pieces.extend(_sentence_pieces(sentence))
                pieces.append(Piece(part, False))
                line = []
            elif part:
                line.append((kind, part))
    return pieces[:-1]


def _sentences(line: list[tuple[str, str]], max_chars: int) -> list[list[tuple[str, str]]]:
    """A line's tokens -> its sentences (whole when short enough), cut after final punctuation outside every inline
    element, like `_split_sentences`: a tag at a cut starts the next sentence."""
    if sum(len(text) for _, text in line) <= max_chars:
        return [line]
    view, where, depth = [], [], 0  # the line's text without tags; each character's (token, offset); open elements
    cuts_allowed = []  # per character of `view`: whether no inline element is open there
    for index, (kind, text) in enumerate(line):
        if kind == "tag":
            depth = max(0, depth + _tag_depth_change(text))
            continue
        shown = text if kind == "text" else (html_lib.unescape(text)[:1] if kind == "entity" else "x")
        for offset, character in enumerate(shown):
            view.append(character)
            where.append((index, offset + 1) if kind == "text" else (index + 1, 0))  # where a cut after it falls
            cuts_allowed.append(depth == 0)
    view = "".join(view)
    sentences, current, last = [], [], (0, 0)
    for match in SENTENCE_END.finditer(view):
        if not cuts_allowed[match.end() - 1]:
            continue
        cut = where[match.end() - 1]
        current = _tokens_between(line, last, cut)
        if current:
            sentences.append(current)
        last = cut
    sentences.append(_tokens_between(line, last, (len(line), 0)))
    return [sentence for sentence in sentences if sentence]


def _tag_depth_change(tag: str) -> int:
    name = _TAG_NAME.match(tag).group(1).lower()
    if tag.endswith("/>") or name in VOID_ELEMENTS:
        return 0
    return -1 if tag.startswith("</") else 1


def _tokens_between(line: list[tuple[str, str]], start: tuple[int, int], end: tuple[int, int]) -> list:
    """The tokens of `line` from (token, offset) `start` to `end`, the text tokens at either end cut there."""
    tokens = []
    for index in range(start[0], min(end[0] + 1, len(line))):
        kind, text = line[index]
        begin = start[1] if index == start[0] else 0
        stop = end[1] if index == end[0] else len(text)
        if text[begin:stop]:
            tokens.append((kind, text[begin:stop]))
    return tokens


def _sentence_pieces(tokens: list[tuple[str, str]]) -> list[Piece]:
    """A sentence -> its outer spaces and enclosing tags (copied) around its core (translated, with its inline tags
    as placeholders). A tag pair that encloses the whole core, a tag that pairs with none in the sentence and a void
    or self-closing tag at either edge are copied: the model sees what is inside."""
    head: list[tuple[str, str]] = []
    tail: list[tuple[str, str]] = []
    core = list(tokens)
    while True:
        before = (len(head), len(tail), core[:1], core[-1:])
        if core and core[0][0] == "text" and core[0][1] != core[0][1].lstrip():
            text = core.pop(0)[1]
            head.append(("text", text[: len(text) - len(text.lstrip())]))
            if text.lstrip():
                core.insert(0, ("text", text.lstrip()))
        if core and core[-1][0] == "text" and core[-1][1] != core[-1][1].rstrip():
            text = core.pop()[1]
            tail.insert(0, ("text", text[len(text.rstrip()) :]))
            if text.rstrip():
                core.append(("text", text.rstrip()))
        partners = _partners(core)
        if core and core[0][0] == "tag" and partners[0] in (None, len(core) - 1):
            if partners[0] is not None:
                tail.insert(0, core.pop())
            head.append(core.pop(0))
        elif core and core[-1][0] == "tag" and partners[-1] is None:
            tail.insert(0, core.pop())
        if (len(head), len(tail), core[:1], core[-1:]) == before:
            break
    pieces = [Piece("".join(text for _, text in head), False)]
    if core:
        pieces.append(Piece("".join(text for _, text in core), True, _html_sentence(core)))
    pieces.append(Piece("".join(text for _, text in tail), False))
    return [piece for piece in pieces if piece.text]


def _partners(tokens: list[tuple[str, str]]) -> list[int | None]:
    """For each token, the index of the tag it pairs with (start with end, innermost first); None for the rest."""
    partners: list[int | None] = [None] * len(tokens)
    open_elements: list[tuple[str, int]] = []
    for index, (kind, text) in enumerate(tokens):
        if kind != "tag" or _tag_depth_change(text) == 0:
            continue
        name = _TAG_NAME.match(text).group(1).lower()
        if not text.startswith("</"):
            open_elements.append((name, index))
            continue
        for position in range(len(open_elements) - 1, -1, -1):
            if open_elements[position][0] == name:
                partners[index], partners[open_elements[position][1]] = open_elements[position][1], index
                del open_elements[position:]
                break
    return partners


def _html_sentence(tokens: list[tuple[str, str]]) -> HtmlSentence:
    """What the model sees of a sentence's tokens, and what puts its translation back into HTML."""
    raw = "".join(text for _, text in tokens)
    parts, elements, entities = [], [], {}
    for index, (kind, text) in enumerate(tokens):
        if kind == "entity":
            following = tokens[index + 1][1] if index + 1 < len(tokens) and tokens[index + 1][0] == "text" else ""
            decoded = _decode_entity(text, following)
            if decoded not in (text, "&"):
                entities.setdefault(decoded, text)
            parts.append(decoded)
        elif kind == "element":
            name = _TAG_NAME.match(text).group(1).lower()
            number = len(elements)
            while f'<{name} id="{number}"/>' in raw:  # a stand-in must be no tag of the sentence's own
                number += 1
            elements.append((f'<{name} id="{number}"/>', text))
            parts.append(elements[-1][0])
        else:
            parts.append(text)
    return HtmlSentence("".join(parts), tuple(elements), tuple(entities.items()))


def _decode_entity(entity: str, following: str) -> str:
    """The character(s) an entity stands for, or the entity itself where decoding would change the markup (`&lt;`,
    `&gt;`, an `&amp;` that would start another entity) or hide a character the model may drop (`&nbsp;`, `&shy;`)."""
    decoded = html_lib.unescape(entity)
    if decoded in ("<", ">") or any(unicodedata.category(character)[0] in "ZC" for character in decoded):
        return entity
    if decoded == "&" and re.match(r"#?[A-Za-z0-9]+;", following):
        return entity
    return decoded


def _merge_copied(pieces: list[Piece]) -> list[Piece]:
    """Adjacent copied pieces are joined (fewer pieces, same text)."""
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
    """Put the translations of the translatable pieces' `source`s, in order, back between the copied pieces."""
    outputs = iter(translations)
    text = "".join(piece.render(next(outputs)) if piece.translate else piece.text for piece in pieces)
    if next(outputs, None) is not None:
        raise ValueError("more translations than translatable pieces")
    return text
