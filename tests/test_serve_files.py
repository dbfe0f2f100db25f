"""`vt-serve`'s web page endpoints and file translation on the tiny export: `/frontend/settings` and `/detect` field
for field as LibreTranslate answers them, `/translate_file` and `/download_file` for text, HTML and gettext catalogs
(oracles: `OrtTranslator` line by line, the server's own `/translate`, and `vt-translate-po` on the same catalog),
every bad upload and download name, API keys, expiry and the temporary folder, and the page's files in the wheels."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import httpx
import polib
import pytest

from tests.onnx_helpers import trained_export_dir
from tests.serve_helpers import live_server, make_service, run_app
from tests.test_po_cli import POT
from tests.test_serve import single
from vanilla_transformer_ort import OrtTranslator
from vanilla_transformer_ort.serve.files import DownloadStore, safe_name

REPO = Path(__file__).resolve().parents[1]
STATIC = ["index.html", "app.js", "style.css"]
PLACEHOLDER = re.compile(r"%[sd]")


@pytest.fixture(scope="module")
def oracle() -> OrtTranslator:
    return OrtTranslator(trained_export_dir(), provider="cpu", intra_op_num_threads=1)


def upload(client, name: str, content: bytes, **fields):
    data = {"source": "en", "target": "de", **fields}
    return client.post("/translate_file", data=data, files={"file": (name, content)})


async def download(client, answer) -> httpx.Response:
    assert answer.status_code == 200, answer.text
    url = answer.json()["translatedFileUrl"]
    assert url.startswith("http://serve.test/download_file/"), url
    return await client.get(url)


def one_line_error(answer, status: int) -> str:
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error and "\n" not in error and "Traceback" not in error
    return error


# -- the page's settings, /detect and the page's files -------------------------------------------------------------


def test_frontend_settings_are_libretranslates_fields():
    async def scenario(client, app):
        return (await client.get("/frontend/settings")).json()

    assert run_app(make_service(char_limit=300, frontend_timeout=250), scenario) == {
        "charLimit": 300,
        "frontendTimeout": 250,
        "apiKeys": False,
        "keyRequired": False,
        "suggestions": False,
        "filesTranslation": True,
        "supportedFilesFormat": [".txt", ".html", ".htm", ".po", ".pot"],
        "language": {"source": {"code": "en", "name": "English"}, "target": {"code": "de", "name": "German"}},
    }
    keyed = run_app(make_service(api_keys=frozenset({"k"}), files_translation=False), scenario)
    assert (keyed["apiKeys"], keyed["keyRequired"]) == (True, True)
    assert (keyed["filesTranslation"], keyed["supportedFilesFormat"]) == (False, [])


def test_detect_names_the_served_source_language():
    async def scenario(client, app):
        return (
            await client.post("/detect", data={"q": "a b c"}),
            await client.post("/detect", json={"q": "q r"}),
            await client.post("/detect", json={}),
            await client.post("/detect", json={"q": ["a"]}),
            await client.post("/detect", json={"q": "a " * 200}),
        )

    form, as_json, missing, listed, long = run_app(make_service(char_limit=100), scenario)
    assert form.json() == as_json.json() == [{"confidence": 100.0, "language": "en"}]
    assert "missing q" in one_line_error(missing, 400)
    assert "string" in one_line_error(listed, 400)
    assert "limit is 100" in one_line_error(long, 400)


def test_libretranslatepy_detect_with_and_without_a_key():
    from urllib.error import HTTPError

    from libretranslatepy import LibreTranslateAPI

    with live_server(make_service(api_keys=frozenset({"secret"}))) as url:
        assert LibreTranslateAPI(url, api_key="secret").detect("a b c") == [{"confidence": 100.0, "language": "en"}]
        for key in (None, "nope"):
            with pytest.raises(HTTPError) as refused:
                LibreTranslateAPI(url, api_key=key).detect("a b c")
            assert refused.value.code == 403


def test_the_page_and_its_files_and_nothing_else():
    async def scenario(client, app):
        paths = ["/", *(f"/static/{name}" for name in STATIC), "/static/files.py", "/static/..%2Ffiles.py"]
        return {path: await client.get(path) for path in paths}

    answers = run_app(make_service(), scenario)
    page = answers["/"]
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert "connect-src 'self'" in page.headers["content-security-policy"]
    for name in STATIC:  # the page names its files relative to itself, and nothing from elsewhere
        assert answers[f"/static/{name}"].status_code == 200
        assert f'"static/{name}"' in page.text or name == "index.html"
    for name, answer in answers.items():
        if answer.status_code == 200:
            assert not re.search(r"(?:src|href)=\"(?:https?:)?//", answer.text), name
            assert "http://" not in answer.text and "https://" not in answer.text, name
    assert answers["/static/app.js"].headers["content-type"].startswith("text/javascript")
    for path in ("/static/files.py", "/static/..%2Ffiles.py"):
        assert answers[path].status_code == 404 and "error" in answers[path].json()


# -- file translation -----------------------------------------------------------------------------------------


def test_text_file_is_translated_line_by_line(oracle):
    text = "\ufeffa b c\n\n  q r s t \r\nm n\n"

    async def scenario(client, app):
        answer = await upload(client, "notes.txt", text.encode())
        metrics = (await client.get("/metrics")).text
        return answer, await download(client, answer), metrics

    answer, got, metrics = run_app(make_service(), scenario)
    assert re.fullmatch(
        r"http://serve\.test/download_file/[0-9a-f]{32}\.notes\.txt", answer.json()["translatedFileUrl"]
    )
    assert got.status_code == 200 and got.headers["content-type"] == "text/plain; charset=utf-8"
    assert got.headers["content-disposition"] == 'attachment; filename="notes.txt"'
    expected = f"\ufeff{single(oracle, 'a b c')}\n\n  {single(oracle, 'q r s t')} \r\n{single(oracle, 'm n')}\n"
    assert got.content.decode("utf-8") == expected
    assert 'vt_requests_total{endpoint="/translate_file",status="200"} 1.0' in metrics


def test_html_file_equals_the_translate_route():
    html = '<!doctype html>\n<html><body><p class="x">a b</p>\n<pre>q r</pre><b>c d</b> &amp; e</body></html>\n'

    async def scenario(client, app):
        answer = await upload(client, "page.html", html.encode())
        route = await client.post("/translate", json={"q": html, "source": "en", "target": "de", "format": "html"})
        return await download(client, answer), route.json()["translatedText"]

    got, route = run_app(make_service(), scenario)
    assert got.headers["content-type"] == "text/html; charset=utf-8"
    assert got.content.decode("utf-8") == route
    assert "<pre>q r</pre>" in route


def test_a_long_file_queues_its_segments_a_chunk_at_a_time(oracle):
    """A file of more distinct lines than --max_queue: the same text as one /translate is a 429, the file goes
    through in chunks and every line is the oracle's."""
    letters = "abcdefghij"
    lines = [f"{a} {b}" for a in letters for b in letters][:90]
    text = "\n".join(lines)

    async def scenario(client, app):
        whole = await client.post("/translate", json={"q": text, "source": "en", "target": "de"})
        return whole, await download(client, await upload(client, "long.txt", text.encode()))

    whole, got = run_app(make_service(max_queue=40), scenario)
    assert whole.status_code == 429
    assert got.text.split("\n") == [single(oracle, line) for line in lines]


def test_catalog_is_filled_as_vt_translate_po_fills_it(tmp_path, capsys):
    """The server's catalog and `vt-translate-po`'s on the same .pot hold the same translations, flags and header
    rules; msgfmt accepts it; every plural form is written and every placeholder kept."""
    from vanilla_transformer_ort.gettext.cli import main

    pot = tmp_path / "app.pot"
    pot.write_text(POT, encoding="utf-8")
    reference = tmp_path / "reference.po"
    assert main([str(pot), str(reference), "--model", str(trained_export_dir()), "--target_lang", "de"]) == 0
    capsys.readouterr()

    async def scenario(client, app):
        answer = await upload(client, "app.pot", POT.encode())
        return answer, await download(client, answer)

    answer, got = run_app(make_service(), scenario)
    assert answer.json()["translatedFileUrl"].endswith(".app.po")  # a filled template is a catalog
    assert got.headers["content-disposition"] == 'attachment; filename="app.po"'
    served_path = tmp_path / "served.po"
    served_path.write_bytes(got.content)
    served, expected = polib.pofile(str(served_path)), polib.pofile(str(reference))
    fields = ("msgctxt", "msgid", "msgid_plural", "msgstr", "msgstr_plural", "flags")
    assert [[getattr(e, f) for f in fields] for e in served] == [[getattr(e, f) for f in fields] for e in expected]
    for name in ("Language", "Plural-Forms", "Content-Type", "X-Generator"):
        assert served.metadata[name] == expected.metadata[name], name
    plural = next(entry for entry in served if entry.msgid_plural)
    assert sorted(plural.msgstr_plural) == [0, 1] and all(plural.msgstr_plural.values())
    for entry in served:  # an independent look at the placeholders: the same %s and %d, in order
        if entry.msgid_plural:
            pairs = [(entry.msgid, entry.msgstr_plural[0]), (entry.msgid_plural, entry.msgstr_plural[1])]
        else:
            pairs = [(entry.msgid, entry.msgstr)]
        for source, translation in pairs:
            assert translation and PLACEHOLDER.findall(translation) == PLACEHOLDER.findall(source), entry
    if shutil.which("msgfmt"):
        check = subprocess.run(["msgfmt", "--check", "-o", "/dev/null", str(served_path)], capture_output=True)
        assert check.returncode == 0, check.stderr


# -- bad uploads: each a one-line JSON 4xx, and nothing left on disk -----------------------------------------------

NOT_A_CATALOG = b'msgid "a"\nmsgstr "b"\nmsgid\n'
BAD_UPLOADS = {
    "too large": (dict(name="big.txt", content=b"a b\n" * 300), {}, 413, "over the limit of 1000 bytes"),
    "unknown type": (dict(name="doc.pdf", content=b"%PDF-1.4"), {}, 400, "file format .pdf is not supported"),
    "no extension": (dict(name="README", content=b"a b"), {}, 400, "(no extension) is not supported"),
    "only an extension": (dict(name=".txt", content=b"a b"), {}, 400, "not supported"),
    "not UTF-8": (dict(name="latin.txt", content="café".encode("latin-1")), {}, 400, "latin.txt is not UTF-8"),
    "not UTF-8 catalog": (dict(name="de.po", content='msgid "é"'.encode("latin-1")), {}, 400, "not UTF-8"),
    "catalog that does not parse": (dict(name="de.po", content=NOT_A_CATALOG), {}, 400, "de.po:3: "),
    "catalog without messages": (dict(name="de.po", content=b'msgid ""\nmsgstr ""\n'), {}, 400, "no messages"),
    "unknown flag": (
        dict(name="de.po", content=b'#, cobol-format\nmsgid "a"\nmsgstr ""\n'),
        {},
        400,
        "unknown format flag",
    ),
    "unknown pair": (dict(name="a.txt", content=b"a"), {"target": "fr"}, 400, "en-fr is not served"),
    "missing target": (dict(name="a.txt", content=b"a"), {"target": ""}, 400, "missing target"),
}


@pytest.mark.parametrize("case", list(BAD_UPLOADS))
def test_bad_upload_gets_its_status_and_one_line(case):
    file, fields, status, words = BAD_UPLOADS[case]

    async def scenario(client, app):
        bad = await upload(client, file["name"], file["content"], **fields)
        return bad, sorted(app.state.downloads.folder.iterdir()), await upload(client, "ok.txt", b"a b")

    bad, left, good = run_app(make_service(max_file_bytes=1000), scenario)
    error = one_line_error(bad, status)
    assert words in error, error
    assert "/tmp" not in error and "vt-serve-files" not in error  # the upload's name, never the server's paths
    assert left == []
    assert good.status_code == 200


def test_requests_that_are_not_an_upload():
    fields = {"source": "en", "target": "de"}

    async def scenario(client, app):
        return (
            await client.post("/translate_file", data=fields),
            await client.post("/translate_file", json=fields),
            await client.post("/translate_file", data=fields, files={"other": ("a.txt", b"a")}),
            await client.post("/translate_file", data={**fields, "file": "a b"}, files={"other": ("a.txt", b"a")}),
            await client.post(
                "/translate_file",
                content=b'--x\r\nContent-Disposition: form-data; name="file"',
                headers={"content-type": "multipart/form-data; boundary=x"},
            ),
            await client.post("/translate_file", files=[("file", ("a.txt", b"a")), ("file", ("b.txt", b"b"))]),
        )

    as_form, as_json, no_file, file_as_text, truncated, two_files = run_app(make_service(), scenario)
    assert "multipart/form-data" in one_line_error(as_form, 400)
    assert "multipart/form-data" in one_line_error(as_json, 400)
    assert "missing file" in one_line_error(no_file, 400)
    assert "missing file" in one_line_error(file_as_text, 400)
    one_line_error(truncated, 400)
    assert "Too many files" in one_line_error(two_files, 400)


def test_files_translation_off_is_403():
    async def scenario(client, app):
        return await upload(client, "a.txt", b"a b")

    assert "disabled" in one_line_error(run_app(make_service(files_translation=False), scenario), 403)


def test_api_keys_guard_the_upload_not_the_download(oracle):
    async def scenario(client, app):
        none = await upload(client, "a.txt", b"a b")
        empty = await upload(client, "a.txt", b"a b", api_key="")  # what the page sends before a key is set
        wrong = await upload(client, "a.txt", b"a b", api_key="nope")
        right = await upload(client, "a.txt", b"a b", api_key="k1")
        return none, empty, wrong, await download(client, right)

    none, empty, wrong, got = run_app(make_service(api_keys=frozenset({"k1"})), scenario)
    assert "API key" in one_line_error(none, 403) and "API key" in one_line_error(empty, 403)
    assert one_line_error(wrong, 403) == "Invalid API key"
    assert got.text == single(oracle, "a b")


@pytest.mark.parametrize(
    "name, status",
    [
        ("..%2F..%2Fetc%2Fpasswd", 400),
        ("%2Fetc%2Fpasswd", 400),
        ("%2e%2e%2f%2e%2e%2fetc%2fpasswd", 400),
        ("..%5C..%5Cwin.ini", 400),
        ("0123456789abcdef0123456789abcdef", 400),  # a token without a name
        ("0123456789abcdef0123456789abcdef.a%00.txt", 400),
        ("0123456789abcdef0123456789abcdef.a.txt", 404),  # well formed, never handed out
        ("ABCDEF0123456789abcdef0123456789.a.txt", 400),
    ],
)
def test_download_names_are_looked_up_never_joined_to_a_path(name, status):
    async def scenario(client, app):
        return await client.get(f"/download_file/{name}")

    one_line_error(run_app(make_service(), scenario), status)


def test_download_store_refuses_path_tricks(tmp_path):
    store = DownloadStore(expiry=60)
    store.open()
    try:
        token, path = store.reserve()
        path.write_text("x")
        download = store.add(token, path, "a.txt", "text/plain")
        assert store.get(download).path == path and path.parent == store.folder
        for name in ["../../etc/passwd", "/etc/passwd", f"{token}.../a.txt", f"{token}./a.txt", f"{token}.a/b.txt"]:
            with pytest.raises(Exception, match="Invalid filename"):
                store.get(name)
        with pytest.raises(Exception, match="no such file"):
            store.get(f"{token}.b.txt")  # the token of another name
    finally:
        store.close()
    assert not path.exists()


def test_upload_names_become_safe_download_names():
    assert safe_name("../../etc/evil.txt") == "evil.txt"
    assert safe_name("C:\\Users\\me\\notes.txt") == "notes.txt"
    assert safe_name("..hidden.po") == "hidden.po"
    assert safe_name("a b;rm -rf.txt") == "a_b_rm_-rf.txt"
    assert safe_name("Übersetzung.txt") == "Übersetzung.txt"
    assert safe_name("x" * 500 + ".po").endswith(".po") and len(safe_name("x" * 500 + ".po")) == 120


def test_downloads_expire_and_the_folder_goes_on_shutdown(oracle, tmp_path, monkeypatch):
    """Nothing is written outside the server's own folder (the system's temporary folder and the working folder are
    watched), a download expires after --download_expiry seconds, and the folder is deleted on shutdown."""
    system_tmp, cwd = tmp_path / "tmp", tmp_path / "cwd"
    system_tmp.mkdir()
    cwd.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))
    monkeypatch.chdir(cwd)

    async def scenario(client, app):
        folder = app.state.downloads.folder
        first = await upload(client, "../../evil.txt", b"a b")
        await upload(client, "de.po", NOT_A_CATALOG)
        await upload(client, "big.txt", b"a b\n" * 10_000)
        written = sorted(path.relative_to(tmp_path) for path in tmp_path.rglob("*") if path.is_file())
        fresh = await download(client, first)
        await asyncio.sleep(1.0)  # the sweep runs every expiry interval
        left = [path for path in folder.iterdir()]
        expired = await client.get(first.json()["translatedFileUrl"])
        return folder, first, written, fresh, left, expired

    service = make_service(download_expiry=0.4, max_file_bytes=20_000)
    folder, first, written, fresh, left, expired = run_app(service, scenario)
    assert folder.parent == system_tmp and folder.name.startswith("vt-serve-files-")
    assert first.json()["translatedFileUrl"].endswith(".evil.txt")
    assert [path.parent for path in written] == [folder.relative_to(tmp_path)]  # the one translation, in the folder
    assert fresh.text == single(oracle, "a b")
    assert left == []  # swept without being asked for
    assert "no such file" in one_line_error(expired, 404)
    assert not folder.exists() and list(system_tmp.iterdir()) == [] and list(cwd.iterdir()) == []


def test_settings_and_flags():
    from vanilla_transformer_ort.serve.cli import build_parser, settings_from_args
    from vanilla_transformer_ort.serve.settings import ServeSettings

    defaults = settings_from_args(build_parser().parse_args(["x"]))
    assert (defaults.download_expiry, defaults.max_file_bytes, defaults.frontend_timeout) == (1800.0, 1048576, 500)
    assert defaults.files_translation
    args = [
        "x",
        "--download_expiry",
        "5",
        "--max_file_bytes",
        "10",
        "--frontend_timeout",
        "0",
        "--no_files_translation",
    ]
    parsed = settings_from_args(build_parser().parse_args(args))
    assert (parsed.download_expiry, parsed.max_file_bytes, parsed.frontend_timeout) == (5.0, 10, 0)
    assert not parsed.files_translation
    for field, value in (("download_expiry", 0), ("max_file_bytes", 0), ("frontend_timeout", -1)):
        with pytest.raises(ValueError, match=field):
            ServeSettings(**{field: value})


# -- the page's files ship in both wheels ----------------------------------------------------------------------


def _wheel_static_files(source: Path, out: Path) -> set[str]:
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", str(out), "."],
        cwd=source,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    return {name.rsplit("/", 1)[1] for name in names if name.startswith("vanilla_transformer_ort/serve/static/")}


def test_both_wheels_ship_the_page(tmp_path):
    """Built from copies (a build leaves build/ and egg-info behind): the runtime's distribution and the full one."""
    ignore = shutil.ignore_patterns("__pycache__", "build", "*.egg-info")
    runtime = tmp_path / "runtime"
    shutil.copytree(REPO / "runtime", runtime, ignore=ignore)
    assert _wheel_static_files(runtime, tmp_path / "runtime-wheel") == set(STATIC)
    full = tmp_path / "full"
    full.mkdir()
    for name in ("pyproject.toml", "README.md", "vanilla_transformer_cli.py"):
        shutil.copy(REPO / name, full / name)
    for name in ("vanilla_transformer", "runtime"):
        shutil.copytree(REPO / name, full / name, ignore=ignore)
    assert _wheel_static_files(full, tmp_path / "full-wheel") == set(STATIC)
