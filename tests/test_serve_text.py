"""serve/text.py: what the server sends to the model. Texts cut into lines and sentences; HTML sentences with their
inline tags, checked against hand-written expectations and against a model that echoes what it is given."""

from __future__ import annotations

import random

import pytest

from vanilla_transformer_ort.serve.text import join, split, split_html, split_text


def sent(pieces) -> list[str]:
    """What the model is given: the translatable pieces' sources."""
    return [piece.source for piece in pieces if piece.translate]


def echo(pieces) -> str:
    """The text put back together from a model that answers what it was given."""
    return join(pieces, sent(pieces))


def test_inline_tags_travel_with_their_sentence():
    pieces = split_html("<p>The file <b>report.txt</b> could not be saved.</p>")
    assert sent(pieces) == ["The file <b>report.txt</b> could not be saved."]
    assert [piece.text for piece in pieces if not piece.translate] == ["<p>", "</p>"]
    attributes = 'Click <a href="/x?a=1&amp;b=2" title="Tom &amp; Jerry">here</a> <span class=\'k\'>now</span>.'
    assert sent(split_html(attributes)) == [attributes]  # tags with their attributes, entities inside tags as is


def test_block_markup_comments_and_breaks_end_sentences():
    pieces = split_html("<div>One.<br>Two <b>three</b></div><p>Four<!-- x -->five</p><table><td>six</td></table>")
    assert sent(pieces) == ["One.", "Two <b>three</b>", "Four", "five", "six"]


def test_tags_around_the_whole_sentence_or_unpaired_at_its_edges_are_copied():
    assert sent(split_html("<p><b>Hello</b></p>")) == ["Hello"]
    assert sent(split_html("<li> <i> <b>spaced</b> out </i> </li>")) == ["<b>spaced</b> out"]
    assert sent(split_html('<img src="i.png"> Save <a href="x">it</a></p>')) == ['Save <a href="x">it</a>']
    assert sent(split_html("a <b>b</b> c</i>")) == ["a <b>b</b> c"]  # an end tag of an element opened elsewhere
    assert sent(split_html("x</b> y")) == ["x</b> y"]  # inside the sentence it stays, as a placeholder


def test_entities_are_decoded_for_the_model_and_encoded_again():
    html = "Caf&eacute; &quot;Le Monde&quot;: Tom &amp; Jerry&#39;s &amp;copy;&nbsp;&lt;b&gt;"
    (piece,) = split_html(html)
    # &amp;copy; stays: decoded it would read as &copy;. &nbsp; and &lt; &gt; stay: layout, and markup the model
    # must not mistake for a tag. Both are placeholders.
    assert piece.source == 'Café "Le Monde": Tom & Jerry\'s &amp;copy;&nbsp;&lt;b&gt;'
    assert echo([piece]) == html  # each character is encoded again as the source had it
    assert piece.render("Café: 3 < 4 & 5 > 4") == "Caf&eacute;: 3 &lt; 4 &amp; 5 &gt; 4"


def test_verbatim_inline_elements_travel_as_one_tag():
    html = "<li>Run <code>ls -l</code> or <kbd>Ctrl</kbd> in <em>your <b>home</b> folder</em>.</li>"
    pieces = split_html(html)
    assert sent(pieces) == ['Run <code id="0"/> or <kbd id="1"/> in <em>your <b>home</b> folder</em>.']
    assert echo(pieces) == html
    # A stand-in is never a tag the sentence has itself.
    (piece,) = [piece for piece in split_html('Use <code id="0"/> or <code>x</code>.') if piece.translate]
    assert piece.source == 'Use <code id="0"/> or <code id="1"/>.'
    assert piece.render('<code id="1"/> statt <code id="0"/>.') == '<code>x</code> statt <code id="0"/>.'
    # Block-level verbatim elements are copied and end the sentence, as before.
    assert sent(split_html("See <pre>a\n b</pre> and <script>x = '<b>'</script>it")) == ["See", "and", "it"]


def test_long_lines_are_cut_between_sentences_outside_inline_elements():
    ones = "One is here. " * 16
    html = f"<p>{ones}<b>Bold one. Still bold.</b> Then <i>it</i>. Last.</p>"
    assert sent(split_html(html)) == ["One is here."] * 16 + ["Bold one. Still bold.", "Then <i>it</i>.", "Last."]
    html = f"<p>{ones}Then <b>bold. Still <i>bold</i>.</b> Last.</p>"  # no cut inside an open element
    assert sent(split_html(html)) == ["One is here."] * 16 + ["Then <b>bold. Still <i>bold</i>.</b>", "Last."]


@pytest.mark.parametrize(
    "html",
    [
        '<p class="x">a b</p> &amp; <b>c</b><code>q r</code><!-- z --><br/>',
        "<ul>\n  <li>A <a href='#'>link</a>, &eacute;t&eacute;.</li>\n</ul>\n",
        "<p>Nested <b>bold <i>and <u>more</u></i></b> &mdash; done&hellip;</p>",
        "text without markup. Two sentences.",
    ],
)
def test_an_echo_gives_back_well_formed_html_unchanged(html):
    assert echo(split_html(html)) == html


def test_pieces_join_back_to_the_input():
    """`"".join(piece.text)` is the input for any text or HTML, malformed included (random fragments)."""
    fragments = ["<b>", "</b>", "<i>", "</i>", '<a href="x">', "</a>", "<p>", "</p>", "<br>", "&amp;", "&lt;",
                 "&nbsp;", "<code>x y</code>", "<code>", "</code>", "a", "b", " ", ". ", "A", "\n", "<", ">", "&",
                 "<!--", "-->", '"', "<img src=x>", '<span class="c">', "</span>", "&amp;copy;"]  # fmt: skip
    generator = random.Random(0)
    for _ in range(2000):
        text = "".join(generator.choice(fragments) for _ in range(generator.randint(0, 40)))
        for max_chars in (200, 5):
            for text_format in ("text", "html"):
                pieces = split(text, text_format, max_chars)
                assert "".join(piece.text for piece in pieces) == text, (text, text_format, max_chars)
    assert [piece.text for piece in split_text("a\nb")] == ["a", "\n", "b"]
