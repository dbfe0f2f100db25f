"""vt-translate-po end to end on the tiny copy model (its words are single letters), and every bad input."""

import shutil
import subprocess
import sys

import polib
import pytest

from vanilla_transformer_ort.gettext.cli import main
from vanilla_transformer_ort.placeholders import same_placeholders

POT = r"""msgid ""
msgstr ""
"Content-Type: text/plain; charset=UTF-8\n"

#: a.c:1
msgid "a b c"
msgstr ""

#, c-format
msgid "q r %s s"
msgstr ""

#, c-format
msgid "%s"
msgstr ""

#, c-format
msgid "m n"
msgid_plural "m n %d"
msgstr[0] ""
msgstr[1] ""

msgctxt "ctx"
msgid "h e"
msgstr "z"
"""


@pytest.fixture(scope="module")
def export_dir():
    from tests.onnx_helpers import trained_export_dir

    return trained_export_dir()


@pytest.fixture
def pot(tmp_path):
    path = tmp_path / "demo.pot"
    path.write_text(POT, encoding="utf-8")
    return path


def run_cli(capsys, *argv):
    status = main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return status, captured.err


def test_translates_a_catalog_with_the_onnx_runtime(export_dir, pot, tmp_path, capsys):
    output = tmp_path / "de.po"
    status, err = run_cli(capsys, pot, output, "--model", export_dir, "--target-lang", "de", "--num_beams", "2")
    assert status == 0, err
    catalog = polib.pofile(str(output))
    entries = {entry.msgid: entry for entry in catalog}
    assert entries["a b c"].msgstr and "fuzzy" in entries["a b c"].flags
    assert entries["a b c"].occurrences == [("a.c", "1")]
    for entry in catalog:
        if entry.msgid_plural:
            assert len(entry.msgstr_plural) == 2
            assert same_placeholders(entry.msgid_plural, entry.msgstr_plural[1], entry.flags)
        elif entry.msgstr:
            assert same_placeholders(entry.msgid, entry.msgstr, entry.flags)
    assert entries["%s"].msgstr == "%s"  # only a placeholder: copied, not an error
    assert entries["h e"].msgstr == "z" and "fuzzy" not in entries["h e"].flags
    assert catalog.metadata["Language"] == "de" and catalog.metadata["Plural-Forms"] == "nplurals=2; plural=(n != 1);"
    assert "entries written" in err
    if shutil.which("msgfmt"):
        check = subprocess.run(["msgfmt", "--check", "-f", "-o", "/dev/null", str(output)], capture_output=True)
        assert check.returncode == 0, check.stderr.decode()


def test_pytorch_model_folder_and_in_place(pot, tmp_path, capsys):
    from tests.onnx_helpers import trained_model_dir

    po = tmp_path / "de.po"
    po.write_text(POT.replace('"Content-Type', '"Language: de\\n"\n"Content-Type'), encoding="utf-8")
    status, err = run_cli(capsys, po, "--in_place", "--model", trained_model_dir(), "--no-fuzzy", "--batch_size", "2")
    assert status == 0, err
    assert "Loading weights" not in err  # transformers' bar: only with --debug
    entries = {entry.msgid: entry for entry in polib.pofile(str(po))}
    assert entries["a b c"].msgstr and "fuzzy" not in entries["a b c"].flags


FUZZY_PO = r"""msgid ""
msgstr ""
"Language: de\n"
"Content-Type: text/plain; charset=UTF-8\n"
"Plural-Forms: nplurals=2; plural=(n != 1);\n"

#, fuzzy
#| msgid "a b"
msgid "a b c"
msgstr "x"

#, fuzzy, c-format
#| msgid "q r %s"
msgid "q r %s s"
msgstr "y %s"

#, fuzzy
#| msgid "m"
#| msgid_plural "m %d"
msgid "m n"
msgid_plural "m n %d"
msgstr[0] "z"
msgstr[1] "z %d"

#, fuzzy
#| msgctxt "old"
msgctxt "ctx"
msgid "h e"
msgstr "w"
"""


def test_overwrite_no_fuzzy_clears_the_mark_of_retranslated_entries(export_dir, tmp_path, capsys):
    """Entries msgmerge left fuzzy, retranslated with --overwrite --no_fuzzy, come out translated: no fuzzy flag,
    no "#|" note of a previous msgid; msgfmt counts them as translated."""
    po, output = tmp_path / "de.po", tmp_path / "new.po"
    po.write_text(FUZZY_PO, encoding="utf-8")
    status, err = run_cli(capsys, po, output, "--model", export_dir, "--overwrite", "--no_fuzzy")
    assert status == 0, err
    assert ", 0 left untranslated" in err
    entries = [entry for entry in polib.pofile(str(output)) if entry.msgid]
    assert len(entries) == 4 and not any("fuzzy" in entry.flags for entry in entries)
    assert entries[1].flags == ["c-format"]
    assert all(entry.previous_msgid is entry.previous_msgctxt is None for entry in entries)
    assert entries[0].msgstr != "x" and entries[3].msgstr != "w"  # retranslated, not only unmarked
    if shutil.which("msgfmt"):
        check = subprocess.run(["msgfmt", "--statistics", "-o", "/dev/null", str(output)], capture_output=True)
        assert check.stderr.decode().strip() == "4 translated messages."


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and "vt-translate-po" in capsys.readouterr().out


BAD_CATALOGS = {
    "syntax": ('msgid ""\nmsgstr ""\n\nmsgid "a"\nmsgstr "b"\n\nmsgid "c"\nthis is garbage\n', r"bad.po:8: "),
    "empty": ("", r"bad.po: the catalog has no messages"),
    "flag": (POT.replace('#, c-format\nmsgid "%s"', '#, c-fromat\nmsgid "%s"'), r"bad.po:\d+: unknown format flag"),
    "plural_header": (
        POT.replace('charset=UTF-8\\n"', 'charset=UTF-8\\n"\n"Plural-Forms: nplurals=2; plural=n ?? 1;\\n"'),
        r"bad.po: its Plural-Forms header does not parse",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CATALOGS))
def test_bad_catalogs_give_one_line_and_status_2(case, export_dir, tmp_path, capsys):
    text, message = BAD_CATALOGS[case]
    bad = tmp_path / "bad.po"
    bad.write_text(text, encoding="utf-8")
    output = tmp_path / "out.po"
    status, err = run_cli(capsys, bad, output, "--model", export_dir, "--target_lang", "de")
    assert status == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("vt-translate-po: error: ")
    import re

    assert re.search(message, err), err
    assert not output.exists()


def test_binary_file_named_po(export_dir, tmp_path, capsys):
    bad = tmp_path / "bad.po"
    bad.write_bytes(b"\xde\x12\x04\x95" + bytes(range(256)))
    status, err = run_cli(capsys, bad, tmp_path / "out.po", "--model", export_dir, "--target_lang", "de")
    assert status == 2 and "bad.po: this is a compiled .mo catalog named .po; rename it to .mo" in err


def test_unknown_language_without_plural_rule(pot, export_dir, tmp_path, capsys):
    status, err = run_cli(capsys, pot, tmp_path / "out.po", "--model", export_dir, "--target_lang", "tlh")
    assert status == 2 and "no plural rule is known for language 'tlh'" in err and "--plural_forms" in err


def test_output_in_a_missing_folder(pot, export_dir, tmp_path, capsys):
    status, err = run_cli(capsys, pot, tmp_path / "missing" / "de.po", "--model", export_dir, "--target_lang", "de")
    assert status == 2 and "does not exist; create it first" in err


def test_output_equal_to_input_needs_in_place(pot, export_dir, tmp_path, capsys):
    status, err = run_cli(capsys, pot, pot, "--model", export_dir, "--target_lang", "de")
    assert status == 2 and "--in_place" in err
    status, err = run_cli(capsys, pot, "--model", export_dir, "--target_lang", "de")
    assert status == 2 and "no OUTPUT given" in err
    status, err = run_cli(capsys, pot, "--output", pot, "--model", export_dir, "--target_lang", "de")
    assert status == 2 and "--in_place" in err


def test_no_language(pot, export_dir, tmp_path, capsys):
    status, err = run_cli(capsys, pot, tmp_path / "de.po", "--model", export_dir)
    assert status == 2 and "pass --target_lang" in err


def test_not_a_model_folder(pot, tmp_path, capsys):
    status, err = run_cli(capsys, pot, tmp_path / "de.po", "--model", tmp_path, "--target_lang", "de")
    assert status == 2 and "neither an ONNX export" in err
    assert not (tmp_path / "de.po").exists()


def test_the_model_folder_is_checked_before_the_catalog(tmp_path, capsys):
    """A missing --model is reported before anything is read from the catalog (here: one that does not parse)."""
    bad = tmp_path / "bad.po"
    bad.write_text(BAD_CATALOGS["syntax"][0], encoding="utf-8")
    status, err = run_cli(capsys, bad, tmp_path / "out.po", "--model", tmp_path / "no-model", "--target_lang", "de")
    assert status == 2 and err.startswith("vt-translate-po: error: --model ") and "no such folder" in err


def with_pair(export_dir, tmp_path, source: str, target: str):
    """A copy of the export whose manifest names the pair `source`-`target`."""
    import json

    folder = tmp_path / f"{source}-{target}"
    shutil.copytree(export_dir, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "source_lang": source, "target_lang": target}))
    return folder


def test_a_model_for_another_language_is_refused(export_dir, pot, tmp_path, capsys):
    """An en→de export asked for a French catalog (by flag or by the catalog's Language) exits 2 and writes
    nothing; a regional variant of its own language (de_AT) is accepted."""
    en_de = with_pair(export_dir, tmp_path, "en", "de")
    output = tmp_path / "fr.po"
    status, err = run_cli(capsys, pot, output, "--model", en_de, "--target_lang", "fr")
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert "translates en→de, but --target_lang asks for 'fr'" in err and "into fr" in err
    assert not output.exists()
    french = tmp_path / "fr-header.po"
    french.write_text(POT.replace('"Content-Type', '"Language: fr\\n"\n"Content-Type'), encoding="utf-8")
    status, err = run_cli(capsys, french, output, "--model", en_de)
    assert status == 2 and "the catalog's Language asks for 'fr'" in err and not output.exists()
    status, err = run_cli(capsys, pot, tmp_path / "de_AT.po", "--model", en_de, "--target_lang", "de_AT")
    assert status == 0, err


def test_pytorch_folders_come_from_a_registered_backend(pot, tmp_path, capsys, monkeypatch):
    """The runtime finds the PyTorch path through the entry point the full package registers, never by importing
    it; without that entry point a model folder gets a one-line error that names the export command."""
    from importlib.metadata import entry_points

    from vanilla_transformer_ort.gettext import cli as po_cli

    (backend,) = [e for e in entry_points(group=po_cli.BACKEND_GROUP) if e.name == po_cli.PYTORCH_BACKEND]
    assert backend.value == "vanilla_transformer.inference:load_batch_translator"
    import re
    from pathlib import Path

    main_package = re.compile(r"^\s*(from vanilla_transformer[ .]|import vanilla_transformer\b(?!_))", re.MULTILINE)
    runtime = Path(po_cli.__file__).parents[1]
    importers = [p.name for p in runtime.rglob("*.py") if main_package.search(p.read_text(encoding="utf-8"))]
    assert importers == [], f"the runtime imports the main package in {importers}"
    from tests.onnx_helpers import trained_model_dir

    monkeypatch.setattr(po_cli, "registered_backend", lambda name: None)
    status, err = run_cli(capsys, pot, tmp_path / "de.po", "--model", trained_model_dir(), "--target_lang", "de")
    assert status == 2 and "needs the vanilla-transformer package" in err and "vt-export-onnx --model" in err


def test_console_script_runs_without_torch(export_dir, pot, tmp_path):
    """The runtime alone is enough: torch imports are refused in the child process."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from vanilla_transformer_ort.gettext.cli import main\n"
        f"sys.exit(main([{str(pot)!r}, {str(tmp_path / 'de.po')!r}, '--model', {str(export_dir)!r}, "
        "'--target_lang', 'de', '--provider', 'cpu']))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "de.po").is_file()
