"""catalog.py: reading catalogs with polib, plural rules, the translate loop and atomic writing, with a fake model."""

import shutil
import subprocess
from pathlib import Path

import polib
import pytest

from vanilla_transformer_ort.gettext.catalog import (
    CatalogError,
    check_output_path,
    load_catalog,
    pretranslate,
    write_catalog,
)
from vanilla_transformer_ort.gettext.plural_forms import (
    compile_plural,
    default_plural_forms,
    parse_plural_forms,
    singular_forms,
)

POT = r"""# Test catalog.
#, fuzzy
msgid ""
msgstr ""
"Project-Id-Version: demo 1.0\n"
"Language: \n"
"MIME-Version: 1.0\n"
"Content-Type: text/plain; charset=CHARSET\n"
"Content-Transfer-Encoding: 8bit\n"
"Plural-Forms: nplurals=INTEGER; plural=EXPRESSION;\n"

#. A translator comment the extractor wrote
#: src/main.c:10
#, c-format
msgid "Open %s"
msgstr ""

#: src/main.c:12
msgctxt "menu"
msgid "_Open"
msgstr ""

#, c-format
msgid "One file"
msgid_plural "%d files"
msgstr[0] ""
msgstr[1] ""

#, c-format
msgid "%s"
msgstr ""

msgid "Already done"
msgstr "Schon erledigt"

#, python-brace-format
msgid "Open {name}\n"
msgstr ""

#~ msgid "Old"
#~ msgstr "Alt"
"""


def german(batch):
    """A fake model that translates a few words and copies everything else."""
    words = {"Open": "Öffnen", "One file": "Eine Datei", "files": "Dateien", "Already done": "Fertig"}
    out = []
    for text in batch:
        for english, deutsch in words.items():
            text = text.replace(english, deutsch)
        out.append(text)
    return out


@pytest.fixture
def pot(tmp_path) -> Path:
    path = tmp_path / "demo.pot"
    path.write_text(POT, encoding="utf-8")
    return path


def translate(path: Path, **kwargs):
    catalog = load_catalog(path)
    report = pretranslate(catalog, path, kwargs.pop("model", german), kwargs.pop("language", "de"), **kwargs)
    return catalog, report


def test_pretranslate_fills_untranslated_and_keeps_the_rest(pot, tmp_path):
    catalog, report = translate(pot)
    by_id = {(entry.msgctxt, entry.msgid): entry for entry in catalog}
    assert by_id[(None, "Open %s")].msgstr == "Öffnen %s"
    assert by_id[(None, "Open %s")].comment == "A translator comment the extractor wrote"
    assert by_id[(None, "Open %s")].occurrences == [("src/main.c", "10")]
    assert by_id[(None, "Open %s")].flags == ["c-format", "fuzzy"]
    assert by_id[("menu", "_Open")].msgstr == "_Öffnen"
    assert by_id[(None, "One file")].msgstr_plural == {0: "Eine Datei", 1: "%d Dateien"}
    assert by_id[(None, "%s")].msgstr == "%s"
    assert by_id[(None, "Already done")].msgstr == "Schon erledigt"  # translated entries stay
    assert "fuzzy" not in by_id[(None, "Already done")].flags
    assert by_id[(None, "Open {name}\n")].msgstr == "Öffnen {name}\n"
    assert [e.msgid for e in catalog.obsolete_entries()] == ["Old"]
    assert (report.candidates, report.translated, report.copied, report.plurals, report.failed) == (5, 4, 1, 1, [])
    assert catalog.metadata["Language"] == "de"
    assert catalog.metadata["Plural-Forms"] == "nplurals=2; plural=(n != 1);"
    assert catalog.metadata["Content-Type"] == "text/plain; charset=UTF-8"
    assert catalog.metadata["X-Generator"].startswith("vt-translate-po")
    output = tmp_path / "de.po"
    write_catalog(catalog, output)
    if shutil.which("msgfmt"):
        check = subprocess.run(["msgfmt", "--check", "-f", "-o", "/dev/null", str(output)], capture_output=True)
        assert check.returncode == 0, check.stderr.decode()


def test_overwrite_and_no_fuzzy(pot):
    catalog, report = translate(pot, overwrite=True, mark_fuzzy=False)
    done = next(entry for entry in catalog if entry.msgid == "Already done")
    assert done.msgstr == "Fertig" and "fuzzy" not in done.flags
    assert report.candidates == 6


def test_entries_that_lose_a_placeholder_stay_untranslated(pot):
    catalog, report = translate(pot, model=lambda batch: ["kaputt" for _ in batch], retry=("percent",))
    entry = next(entry for entry in catalog if entry.msgid == "Open %s")
    assert entry.msgstr == "" and "fuzzy" not in entry.flags
    assert {msgid for _, msgid, _ in report.failed} == {"Open %s", "One file", "Open {name}\n"}
    assert all(line > 0 for line, _, _ in report.failed)


def test_plural_rules_for_other_languages(pot):
    catalog, _ = translate(pot, language="ru")
    entry = next(entry for entry in catalog if entry.msgid == "One file")
    # Russian uses form 0 for 21 too: every form takes the plural's translation, which carries %d.
    assert entry.msgstr_plural == {0: "%d Dateien", 1: "%d Dateien", 2: "%d Dateien"}
    catalog, _ = translate(pot, language="ja")
    assert next(e for e in catalog if e.msgid == "One file").msgstr_plural == {0: "%d Dateien"}


def test_unknown_language_without_plural_rule_is_an_error(pot):
    with pytest.raises(CatalogError, match="no plural rule is known for language 'tlh'.*--plural_forms"):
        translate(pot, language="tlh")
    catalog, _ = translate(pot, language="tlh", plural_forms="nplurals=1; plural=0;")
    assert catalog.metadata["Plural-Forms"] == "nplurals=1; plural=0;"


def test_plural_forms_header_that_does_not_parse(pot):
    pot.write_text(POT.replace("nplurals=INTEGER; plural=EXPRESSION;", "nplurals=2; plural=(n !! 1);"))
    with pytest.raises(CatalogError, match=r"demo.pot: its Plural-Forms header does not parse"):
        translate(pot)


def test_unknown_format_flag_names_the_line(pot):
    pot.write_text(POT.replace("#, python-brace-format", "#, python-brace-fromat"))
    message = r"demo.pot:\d+: unknown format flag 'python-brace-fromat'; did you mean 'python-brace-format'\? Or"
    with pytest.raises(CatalogError, match=message):
        translate(pot)
    pot.write_text(POT.replace("#, python-brace-format", "#, foo-format"))  # no known flag close enough to suggest
    with pytest.raises(CatalogError, match=r"demo.pot:\d+: unknown format flag 'foo-format'; correct it \(c-format"):
        translate(pot)


@pytest.mark.parametrize(
    "expression, values",
    [
        ("(n != 1)", {0: 1, 1: 0, 2: 1}),
        ("n>1", {0: 0, 1: 0, 2: 1}),
        (
            "(n%10==1 && n%100!=11 ? 0 : n%10>=2 && n%10<=4 && (n%100<10 || n%100>=20) ? 1 : 2)",
            {1: 0, 3: 1, 11: 2, 21: 0},
        ),
        ("(n==1) ? 0 : (n>=2 && n<=4) ? 1 : 2", {1: 0, 3: 1, 5: 2}),
        ("!(n == 1)", {1: 0, 5: 1}),
    ],
)
def test_compile_plural(expression, values):
    function = compile_plural(expression)
    assert {n: function(n) for n in values} == values


@pytest.mark.parametrize(
    "header", ["nplurals=2; plural=(n != 1", "nplurals=two; plural=n;", "nplurals=2; plural=n*;", "plural=n;",
               "nplurals=2; plural=import os;", "nplurals=2; plural=n+5;"]
)  # fmt: skip
def test_parse_plural_forms_rejects(header):
    with pytest.raises(ValueError):
        parse_plural_forms(header)


def test_default_plural_forms_and_singular_forms():
    assert default_plural_forms("pt_BR") == "nplurals=2; plural=(n > 1);"
    assert default_plural_forms("de_AT.UTF-8") == default_plural_forms("de")
    assert default_plural_forms("sr@latin") == default_plural_forms("sr")
    assert default_plural_forms("tlh") is None
    assert singular_forms(*parse_plural_forms(default_plural_forms("fr"))) == {0}
    assert singular_forms(*parse_plural_forms(default_plural_forms("ru"))) == set()


def test_load_errors_name_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.po"
    bad.write_text('msgid ""\nmsgstr ""\n\nmsgid "a"\nmsgstr "b"\n\nmsgid "c"\nthis is garbage\n')
    with pytest.raises(CatalogError, match=r"bad.po:8: "):
        load_catalog(bad)
    binary = tmp_path / "binary.po"
    binary.write_bytes(b"\x95\x04\x12\xde" + bytes(range(256)))
    with pytest.raises(CatalogError, match="compiled .mo catalog named .po; rename it to .mo"):
        load_catalog(binary)
    latin = tmp_path / "latin.po"
    latin.write_bytes(b'msgid "caf\xe9"\nmsgstr ""\n')
    with pytest.raises(CatalogError, match="not UTF-8"):
        load_catalog(latin)


def test_reads_mo(pot, tmp_path):
    catalog, _ = translate(pot, mark_fuzzy=False)  # fuzzy entries are not compiled
    po = tmp_path / "de.po"
    catalog.save(str(po))
    mo = tmp_path / "de.mo"
    catalog.save_as_mofile(str(mo))
    loaded = load_catalog(mo)
    assert isinstance(loaded, polib.MOFile)
    assert any(entry.msgid == "Open %s" for entry in loaded)
    report = pretranslate(loaded, mo, german, "de", overwrite=True)
    assert report.candidates == report.translated + report.copied > 0
    write_catalog(loaded, tmp_path / "from-mo.po")
    again = polib.pofile(str(tmp_path / "from-mo.po"))
    assert again.metadata["Language"] == "de" and any(e.msgstr == "Fertig" for e in again)
    with pytest.raises(CatalogError, match="give it a .po name"):
        check_output_path(mo, tmp_path / "out.mo", in_place=False)


def test_output_path_checks(pot, tmp_path):
    with pytest.raises(CatalogError, match="does not exist; create it first"):
        check_output_path(pot, tmp_path / "missing" / "de.po", in_place=False)
    with pytest.raises(CatalogError, match="--in_place"):
        check_output_path(pot, pot, in_place=False)
    check_output_path(pot, pot, in_place=True)


def test_write_is_atomic(pot, tmp_path):
    catalog, _ = translate(pot)
    output = tmp_path / "de.po"
    output.write_text("previous")

    class Boom(Exception):
        pass

    def fail(path):
        Path(path).write_text("partial")
        raise Boom

    catalog.save = fail
    with pytest.raises(Boom):
        write_catalog(catalog, output)
    assert output.read_text() == "previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["de.po", "demo.pot"]
