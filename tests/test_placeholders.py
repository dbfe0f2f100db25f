"""placeholders.py: masking, restoring and verifying placeholders, and the retry chain, with fake translators."""

import pytest

from vanilla_transformer_ort.placeholder_syntax import closest_flag, unknown_flags
from vanilla_transformer_ort.placeholders import (
    find_accelerator,
    find_spans,
    placeholders,
    protect,
    restore,
    same_placeholders,
)
from vanilla_transformer_ort.protected_translation import translate_protected

C = ("c-format",)


@pytest.mark.parametrize(
    "text, flags, expected",
    [
        ("Cannot open %s: %s", C, ["%s", "%s"]),
        ("%1$s has %2$d items (%3$5.2f%%)", C, ["%1$s", "%2$d", "%3$5.2f", "%%"]),
        ("Size: %lu bytes, %<PRId64> blocks", C, ["%lu", "%<PRId64>"]),
        ("Hello %(name)s, %(count)d new", ("python-format",), ["%(name)s", "%(count)d"]),
        ("{} of {total:>3} in {0[key]}", ("python-brace-format",), ["{}", "{total:>3}", "{0[key]}"]),
        ("Copy %1 to %L2 (%n)", ("qt-format",), ["%1", "%L2", "%n"]),
        ('<b>Bold</b> &amp; <a href="x.html">link</a>', (), ["<b>", "</b>", "&amp;", '<a href="x.html">', "</a>"]),
        (
            "See https://example.org/a?b=1. Mail bugs@example.org",
            (),
            ["https://example.org/a?b=1", "bugs@example.org"],
        ),
        ("Line one\nLine\ttwo \\n", (), ["\n", "\t", "\\n"]),
        ("%s and {0} without flags", (), ["%s", "{0}"]),
    ],
)
def test_find_spans_per_format(text, flags, expected):
    assert [span.text for span in find_spans(text, flags)] == expected


def test_flags_decide_what_is_a_directive():
    # python-brace-format: %s is plain text; c-format: {0} is plain text except as a look-alike of our own tokens.
    assert [s.text for s in find_spans("50%s {x}", ("python-brace-format",), "none")] == ["{x}"]
    assert [s.text for s in find_spans("%s {x}", ("no-c-format", "no-python-brace-format"), "none")] == []
    assert [s.kind for s in find_spans("%s {0}", C, "brace")] == ["c-format", "literal"]


def test_protect_masks_and_restore_puts_back():
    protected = protect("Cannot open <b>%s</b>: %s", C)
    assert protected.masked == "Cannot open {0}{1}{2}: {3}"
    assert restore("Kann {0}{1}{2} nicht öffnen: {3}", protected) == "Kann <b>%s</b> nicht öffnen: %s"
    percent = protect("Cannot open %s", C, "percent")
    assert percent.masked == "Cannot open %1"
    assert restore("Kann %1 nicht öffnen", percent) == "Kann %s nicht öffnen"


@pytest.mark.parametrize(
    "output", ["Kann {0} nicht öffnen", "Kann {0} {0} {1} öffnen", "Kann {0} {1} {2} öffnen", "Kann nicht öffnen"]
)
def test_restore_refuses_missing_duplicated_or_invented(output):
    assert restore(output, protect("Cannot open %s: %s", C)) is None


def test_restore_refuses_directive_the_model_wrote():
    # "50 % der" holds "% d", a printf directive msgfmt would count.
    assert restore("50 % der {0}", protect("Half of %s", C)) is None


def test_restore_refuses_stray_percent_or_brace_under_a_format_flag():
    assert restore("{0} zu 100 %", protect("%s at 100%%", C)) is None  # msgfmt: incomplete directive
    assert restore("{0} zu 100 {1}", protect("%s at 100%%", C)) == "%s zu 100 %%"
    assert restore("{0} {x", protect("{0} of", ("python-brace-format",))) is None
    assert restore("{0} zu 100 %", protect("%s at 100", ())) == "%s zu 100 %"  # no flag: msgfmt does not check
    assert restore("Kann { 0 } öffnen", protect("Open %s", C)) == "Kann %s öffnen"


def test_restore_refuses_tags_out_of_order():
    """Tags may move with their words, never out of their pairs: an end tag before its start tag, or elements
    crossed, is broken markup even though every tag is there."""
    protected = protect('The <b>file</b> is in <a href="x">your <i>home</i> folder</a>.', style="none")
    assert restore('<b>Die Datei</b> liegt in <a href="x">deinem <i>Ordner</i></a>.', protected) is not None
    assert restore('In <a href="x"><i>home</i> your</a> is the <b>file</b>.', protected) is not None
    assert restore('The </b>file<b> is in <a href="x">your <i>home</i> folder</a>.', protected) is None
    assert restore('The <b>file</b> is in <a href="x">your <i>home</a> folder</i>.', protected) is None
    masked = protect("<b>A <i>b</i></b> c", style="brace")
    assert masked.masked == "{0}A {1}b{2}{3} c"
    assert restore("{0}A {1}b{2}{3} C", masked) == "<b>A <i>b</i></b> C"
    assert restore("{0}A {1}b{3}{2} C", masked) is None
    # void and self-closing elements pair with nothing; a source's own unpaired tag may stay unpaired
    assert restore("A<br>B <x/> C", protect("a <x/> b<br>c", style="none")) is not None
    assert restore("</p>A", protect("a</p>", style="none")) is not None


def test_reordered_printf_becomes_positional_under_c_format_only():
    assert restore("{1} Dateien in {0}", protect("In %s: %d files", C)) == "%2$d Dateien in %1$s"
    assert restore("{1} Dateien in {0}", protect("In %s: %d files", ("python-format",))) is None
    # named and positional arguments may move freely
    named = protect("In %(dir)s: %(n)d files", ("python-format",))
    assert restore("{1} Dateien in {0}", named) == "%(n)d Dateien in %(dir)s"


def test_edge_whitespace_and_newlines_are_kept_verbatim():
    protected = protect("\nUsage: %s [OPTION]\n\tmore\n", C)
    assert protected.masked == "Usage: {0} [OPTION]{1}more"
    assert restore(" Aufruf: {0} [OPTION]{1}mehr ", protected) == "\nAufruf: %s [OPTION]\n\tmehr\n"


@pytest.mark.parametrize(
    "text, marker, masked",
    [("_Open", "_", "Open"), ("E_xit", "_", "Exit"), ("Save _As…", "_", "Save As…"), ("&File", "&", "File")],
)
def test_accelerators_are_removed_and_put_back(text, marker, masked):
    protected = protect(text)
    assert (protected.accelerator, protected.masked) == (marker, masked)


def test_accelerator_goes_before_the_same_letter_or_the_first():
    assert restore("Datei _öffnen", protect("_Open")) == "Datei _öffnen"  # the model kept one: counted, not doubled
    assert restore("Öffnen", protect("_Open")) == "_Öffnen"  # no o: the first letter
    assert restore("Beenden", protect("E_xit")) == "_Beenden"
    assert restore("Speichern als", protect("Save _As…")) == "Speichern _als"  # the same letter, word start first
    assert restore("{0}{1}{2} Datei", protect("<b>%s</b> _file", C)) == "<b>%s</b> _Datei"  # never in a tag


def test_accelerator_not_mistaken():
    for text in ("file_name", "BUS_NAME", "%s_%d", "GTK__X", "Tom & Jerry", "&amp; more", "_a and _b"):
        spans = find_spans(text, C, "none")
        assert find_accelerator(text, spans) == (None, -1), text


def test_placeholder_only_is_not_translatable():
    for text in ("%s", "%s: %s", "<b>%s</b>", "%d%%", "  {0}  "):
        assert not protect(text, C + ("python-brace-format",)).is_translatable
    assert protect("%s files", C).is_translatable


def test_placeholders_measure_counts_accelerators_and_positional_rewrites():
    assert same_placeholders("_Open %s", "Ö_ffnen %s", C)  # a marker anywhere counts
    assert not same_placeholders("_Open %s", "Öffnen %s", C)
    assert not same_placeholders("_Open %s", "_Datei ö_ffnen %s", C)
    assert placeholders("<b>%s</b>", C) == placeholders("<b>%s</b> danach", C)
    assert same_placeholders("In %s: %d files", "%2$d Dateien in %1$s", C)
    assert not same_placeholders("In %s: %d files", "%d Dateien", C)


def test_unknown_flags():
    assert unknown_flags(["fuzzy", "c-format", "no-python-format", "c-fromat", "range"]) == ["c-fromat"]


def test_closest_flag_suggests_only_a_typo():
    assert closest_flag("c-fromat") == closest_flag("no-c-fromat") == "c-format"
    assert closest_flag("pyhton-brace-format") == "python-brace-format"
    assert closest_flag("foo-format") is closest_flag("markdown-format") is None  # unknown, but no typo of one


def german(batch):
    """A fake model: translates two words, copies the rest."""
    return [text.replace("Open", "Öffnen").replace("files", "Dateien") for text in batch]


def test_translate_protected_batches_and_copies_placeholder_only():
    calls = []

    def model(batch):
        calls.append(list(batch))
        return german(batch)

    results = translate_protected(model, ["Open %s", "%s", "%d files"], [C, C, C], batch_size=8)
    assert [r.translation for r in results] == ["Öffnen %s", "%s", "%d Dateien"]
    assert [r.status for r in results] == ["translated", "copied", "translated"]
    assert [r.attempts for r in results] == [["verbatim"], [], ["verbatim"]]
    assert calls == [["Open %s", "%d files"]]  # one call, shortest first; placeholder-only texts never sent


def test_translate_protected_retries_then_fails_without_writing():
    def drops_percent_s(batch):
        return [text.replace("%s", "") for text in batch]

    # the text as it is loses %s; the %1 mask survives this model
    result = translate_protected(drops_percent_s, ["Open %s"], [C])[0]
    assert (result.translation, result.status, result.attempts) == ("Open %s", "retried", ["verbatim", "percent"])

    def drops_braces(batch):
        return [text.replace("{0}", "").replace("{1}", "") for text in batch]

    result = translate_protected(drops_braces, ["Open %s"], [C], style="brace", retry=("alternate",))[0]
    assert (result.translation, result.attempts) == ("Open %s", ["brace", "alternate"])  # alternate: percent

    def drops_everything(batch):
        return ["nichts" for _ in batch]

    result = translate_protected(drops_everything, ["Open %s"], [C], retry=("percent", "brace", "verbatim"))[0]
    assert result.translation is None and result.status == "failed"
    assert result.attempts == ["verbatim", "percent", "brace"] and "placeholder" in result.reason


def test_segments_fallback_keeps_placeholders_in_source_order():
    def drops_placeholders(batch):
        return [" ".join(word for word in text.split() if "{" not in word and "%" not in word) for text in batch]

    result = translate_protected(drops_placeholders, ["Open %s: %d files"], [C], retry=("segments",))[0]
    assert result.translation == "Open %s: %d files" and result.attempts == ["verbatim", "segments"]


def test_tags_crossed_by_the_model_are_retried_masked():
    def crosses_tags(batch):  # moves </i> after </b> as it is; copies masks
        return [text.replace("</i></b>", "</b></i>") for text in batch]

    result = translate_protected(crosses_tags, ["<b>Bold <i>and italic</i></b> text"])[0]
    assert result.translation == "<b>Bold <i>and italic</i></b> text" and result.attempts == ["verbatim", "percent"]


def test_segments_fallback_refuses_a_piece_answered_with_nothing():
    def drops_placeholders_and_short_pieces(batch):
        return ["" if len(text.strip()) < 4 else text.replace("%s", "").upper() for text in batch]

    result = translate_protected(drops_placeholders_and_short_pieces, ["Open %s now"], [C], retry=("segments",))[0]
    assert result.translation is None and result.attempts == ["verbatim", "segments"]  # not "OPEN %s"


def test_model_underscore_is_not_an_invented_accelerator():
    # "service_browser" has no accelerator; "Dienst_browser" must not count as one.
    assert same_placeholders("service_browser failed: %s", "Dienst_browser fehlgeschlagen: %s", C)


def test_break_moved_to_an_edge_is_refused():
    # msgfmt: msgid and msgstr must begin and end alike; "Binary\nSource" -> "Binary\n" is rejected.
    assert restore("Binary {0}", protect("Binary\nSource")) is None
    assert restore("Binär{0}Quelle", protect("Binary\nSource")) == "Binär\nQuelle"


def test_translate_protected_checks_its_inputs():
    with pytest.raises(ValueError, match="flags_per_text"):
        translate_protected(german, ["a"], [C, C])
    with pytest.raises(ValueError, match="retry"):
        translate_protected(german, ["a"], retry=("pray",))
    with pytest.raises(ValueError, match="returned 0"):
        translate_protected(lambda batch: [], ["Open"])
