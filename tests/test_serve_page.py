"""`vt-serve`'s web page in a real headless Chromium (Debian's, driven by Playwright as tests/test_browser_example.py
does): typing translates as `/translate` does, swapping runs the reverse pair, a .po upload downloads a catalog
that msgfmt accepts, and with API keys required a missing key shows the server's error and a valid one translates.
Every request the page makes is recorded: none may leave the server it came from."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from urllib.parse import parse_qs, urlsplit

import httpx
import polib
import pytest

from tests.onnx_helpers import trained_export_dir
from tests.serve_helpers import live_server, make_service
from tests.test_browser_example import CHROMIUM, CHROMIUM_ARGS, requires_chromium
from tests.test_po_cli import POT
from vanilla_transformer_ort.serve.models import parse_model_spec
from vanilla_transformer_ort.serve.service import TranslationService
from vanilla_transformer_ort.serve.settings import ServeSettings

pytestmark = requires_chromium
TIMEOUT_MS = 30_000
PLACEHOLDER = re.compile(r"%[sd]")


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def two_way_server(tmp_path_factory):
    """en-de and de-en (one folder whose manifest names no pair, so both may be served), in a thread."""
    folder = tmp_path_factory.mktemp("two-way") / "onnx"
    shutil.copytree(trained_export_dir(), folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({k: v for k, v in manifest.items() if "lang" not in k}))
    specs = [parse_model_spec(f"en-de={folder}"), parse_model_spec(f"de-en={folder}")]
    settings = ServeSettings(threads=1, sessions=1, session_workers="thread", char_limit=200, frontend_timeout=300)
    with live_server(TranslationService(specs, settings)) as url:
        yield url


class Visit:
    """A fresh browser context on the server's page: every request it makes, those stopped for leaving the server,
    and the page's script errors."""

    def __init__(self, browser, url: str):
        self.origin = urlsplit(url).netloc
        self.requests: list[str] = []
        self.blocked: list[str] = []
        self.errors: list[str] = []
        self.context = browser.new_context(accept_downloads=True)
        self.context.on("request", lambda request: self.requests.append(request.url))
        self.context.route("**/*", self._only_the_server)
        self.page = self.context.new_page()
        self.page.set_default_timeout(TIMEOUT_MS)
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.goto(url)
        self.page.wait_for_selector("#status[data-state=idle]", state="attached")

    def _only_the_server(self, route):
        url = urlsplit(route.request.url)
        if url.scheme in ("http", "https", "ws", "wss") and url.netloc != self.origin:
            self.blocked.append(route.request.url)
            route.abort("blockedbyclient")
        else:
            route.continue_()

    def type_and_wait(self, text: str) -> str:
        self.page.fill("#q", "")
        self.page.type("#q", text, delay=15)
        self.page.wait_for_selector("#status[data-state=done], #status[data-state=error]", state="attached")
        return self.page.input_value("#translation")

    def close(self) -> None:
        """Check that nothing was sent anywhere but the server, then close."""
        try:
            assert self.errors == []
            assert self.blocked == [], f"the page tried to reach other hosts: {self.blocked}"
            assert self.requests and all(urlsplit(url).netloc == self.origin for url in self.requests), self.requests
        finally:
            self.context.close()


def translate_route(url: str, text: str, source: str = "en", target: str = "de", **fields) -> str:
    answer = httpx.post(f"{url}/translate", data={"q": text, "source": source, "target": target, **fields})
    assert answer.status_code == 200, answer.text
    return answer.json()["translatedText"]


def test_typing_translates_as_the_api_does_and_swap_runs_the_reverse_pair(browser, two_way_server):
    visit = Visit(browser, two_way_server)
    page = visit.page
    try:
        assert page.locator("#source option").evaluate_all("options => options.map(o => o.value)") == ["en", "de"]
        assert page.locator("#target option").evaluate_all("options => options.map(o => o.value)") == ["de"]
        assert page.get_attribute("#q", "maxlength") == "200"
        text = "a b c\nq r s t"
        translation = visit.type_and_wait(text)
        assert page.get_attribute("#status", "data-state") == "done"
        assert translation and translation == translate_route(two_way_server, text)
        calls = [url for url in visit.requests if urlsplit(url).path == "/translate"]
        assert 1 <= len(calls) < len(text) // 2, calls  # debounced: not one request a keystroke
        assert page.inner_text("#count") == f"{len(text)} / 200"
        query = parse_qs(urlsplit(page.url).query)
        assert (query["source"], query["target"], query["q"]) == (["en"], ["de"], [text])

        page.click("#swap")
        page.wait_for_selector("#status[data-state=done]", state="attached")
        assert (page.input_value("#source"), page.input_value("#target")) == ("de", "en")
        assert page.input_value("#q") == translation
        assert page.input_value("#translation") == translate_route(two_way_server, translation, "de", "en")
    finally:
        visit.close()


def test_a_po_upload_downloads_a_catalog_msgfmt_accepts(browser, two_way_server, tmp_path):
    if shutil.which("msgfmt") is None:
        pytest.skip("msgfmt (GNU gettext) is not installed: apt-get install gettext")
    pot = tmp_path / "app.pot"
    pot.write_text(POT, encoding="utf-8")
    visit = Visit(browser, two_way_server)
    page = visit.page
    try:
        page.click("#tab-files")
        assert page.inner_text("#formats") == ".txt, .html, .htm, .po, .pot"
        page.set_input_files("#file", str(pot))
        with page.expect_download() as download_info:
            page.click("#translate-file")
        download = download_info.value
        assert download.suggested_filename == "app.po"
        catalog_path = tmp_path / "de.po"
        download.save_as(str(catalog_path))
        assert page.get_attribute("#file-status", "data-state") == "done"
    finally:
        visit.close()
    check = subprocess.run(["msgfmt", "--check", "-o", "/dev/null", str(catalog_path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    catalog = polib.pofile(str(catalog_path))
    assert catalog.metadata["Language"] == "de" and catalog.metadata["Plural-Forms"] == "nplurals=2; plural=(n != 1);"
    plural = next(entry for entry in catalog if entry.msgid_plural)
    assert all(plural.msgstr_plural[n] for n in (0, 1))
    assert PLACEHOLDER.findall(plural.msgstr_plural[1]) == PLACEHOLDER.findall(plural.msgid_plural)
    for entry in catalog:
        if not entry.msgid_plural:
            assert entry.msgstr and PLACEHOLDER.findall(entry.msgstr) == PLACEHOLDER.findall(entry.msgid)


def test_with_keys_required_a_missing_key_is_an_error_and_a_valid_one_translates(browser, tmp_path):
    with live_server(make_service(api_keys=frozenset({"secret"}), frontend_timeout=100)) as url:
        visit = Visit(browser, url)
        page = visit.page
        try:
            assert page.is_visible("#api-key") and page.is_visible("#key-notice")
            assert visit.type_and_wait("a b") == ""
            assert page.get_attribute("#status", "data-state") == "error"
            assert "API key" in page.inner_text("#error")

            page.once("dialog", lambda dialog: dialog.accept("secret"))
            page.click("#api-key")
            page.wait_for_selector("#status[data-state=done]", state="attached")
            assert page.input_value("#translation") == translate_route(url, "a b", api_key="secret")
            assert not page.is_visible("#error") and not page.is_visible("#key-notice")

            text_file = tmp_path / "notes.txt"
            text_file.write_text("q r s\n", encoding="utf-8")
            page.click("#tab-files")
            page.set_input_files("#file", str(text_file))
            with page.expect_download() as download_info:
                page.click("#translate-file")
            saved = tmp_path / "saved.txt"
            download_info.value.save_as(str(saved))
            assert saved.read_text(encoding="utf-8") == translate_route(url, "q r s\n", api_key="secret")
        finally:
            visit.close()
