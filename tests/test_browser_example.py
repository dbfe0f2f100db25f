"""The browser example (examples/browser) in a real headless Chromium translates like this package's own runtime.

examples/browser/serve.py serves the page, transformers.js and the standard-layout export on localhost; Playwright
drives Debian's /usr/bin/chromium (never a downloaded browser), types the sentences and reads the page's
translations, first with the fp32 graphs and then with the int8 ones, and compares them with `vanilla_transformer_ort`
on our own fp32 and int8 exports of the same model (tests/js_helpers.py); the int8 one with its integer products
computed exactly, as onnxruntime's WebAssembly build computes them, whatever the CPU's native kernel does
(`exact_int8_copy`). Every request that is not to the page's own server is blocked and recorded; none may be made.

Set VT_BROWSER_SCREENSHOT=PATH to save a screenshot of the page after the fp32 translation (docs/browser.md shows one).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.js_helpers import (
    MAX_NEW_TOKENS,
    SENTENCES,
    installed_transformers_js,
    reference_translations,
    standard_export_dir,
)

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
SERVE = Path(__file__).resolve().parents[1] / "examples" / "browser" / "serve.py"
SERVER_START_TIMEOUT_S = 120
TRANSLATE_TIMEOUT_MS = 180_000
SCREENSHOT_VARIABLE = "VT_BROWSER_SCREENSHOT"

requires_chromium = pytest.mark.skipif(not CHROMIUM.is_file(), reason=f"Chromium is not installed at {CHROMIUM}")


@pytest.fixture(scope="module")
def server():
    """serve.py on a free port with the standard-layout export; yields the page's URL."""
    installed_transformers_js()  # skips when npm cannot reach its registry; serve.py then finds the cache ready
    process = subprocess.Popen(
        [sys.executable, str(SERVE), "--model", str(standard_export_dir()), "--port", "0", "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = process.stdout.readline()  # "Serving ... at http://127.0.0.1:PORT/ ..." once it listens
        match = re.search(r"http://127\.0\.0\.1:\d+/", line)
        if match is None:
            process.kill()
            pytest.fail(f"serve.py did not start: {line}{process.stderr.read()[-3000:]}")
        yield match.group(0)
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def browser_page(server, tmp_path_factory):
    """A Chromium page on the example, with a fresh profile; yields (page, blocked requests, page errors)."""
    from playwright.sync_api import sync_playwright

    origin = urlsplit(server).netloc
    blocked, errors = [], []

    def only_the_server(route):
        url = urlsplit(route.request.url)
        if url.scheme in ("http", "https", "ws", "wss") and url.netloc != origin:
            blocked.append(route.request.url)
            route.abort("blockedbyclient")
        else:
            route.continue_()

    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
            headless=True, viewport={"width": 1100, "height": 720},
        )  # fmt: skip
        try:
            context.route("**/*", only_the_server)
            page = context.new_page()
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(server)
            page.wait_for_selector("#status[data-state=ready]", timeout=60_000)
            yield page, blocked, errors
        finally:
            context.close()


def translate_on_page(page, dtype: str) -> list[str]:
    """Pick `dtype`, type the sentences, press Translate; the page's translations, one per sentence."""
    page.select_option("#dtype", dtype)
    page.fill("#max-new-tokens", str(MAX_NEW_TOKENS))
    page.fill("#source", "")
    page.type("#source", "\n".join(SENTENCES))
    page.click("#translate")
    page.wait_for_selector("#status[data-state=done], #status[data-state=error]", timeout=TRANSLATE_TIMEOUT_MS)
    status = page.inner_text("#status")
    assert page.get_attribute("#status", "data-state") == "done", status
    assert dtype in status, status
    return page.locator("#output li").all_inner_texts()


def test_serve_refuses_a_folder_that_is_not_the_standard_layout(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "tokenizer_config.json").write_text("{}")
    result = subprocess.run([sys.executable, str(SERVE), "--model", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "vt-export-onnx --layout optimum" in result.stderr, result.stderr


def test_server_serves_its_files_and_nothing_else(server):
    def get(path: str):
        try:
            with urllib.request.urlopen(server + path, timeout=30) as response:
                return response.status, response.headers, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.headers, b""

    status, headers, body = get("")
    assert status == 200 and b'src="app.js"' in body
    assert headers["Cross-Origin-Embedder-Policy"] == "require-corp"  # WebAssembly threads
    status, headers, _ = get("vendor/ort-wasm-simd-threaded.asyncify.wasm")
    assert (status, headers["Content-Type"]) == (200, "application/wasm")
    (listing,) = json.loads(get("models.json")[2])
    assert listing["dtypes"] == ["fp32", "q8"]
    assert get(f"models/{listing['id']}/onnx/encoder_model_quantized.onnx")[0] == 200
    for path in ("models/", f"models/{listing['id']}/", f"models/{listing['id']}/%2e%2e/%2e%2e/etc/passwd", "tests"):
        assert get(path)[0] == 404, path


@requires_chromium
def test_page_lists_both_precisions(browser_page):
    page, _, _ = browser_page
    assert page.locator("#dtype option").evaluate_all("options => options.map(o => o.value)") == ["fp32", "q8"]


@requires_chromium
@pytest.mark.parametrize("dtype", ["fp32", "q8"])
def test_browser_translates_like_our_runtime(browser_page, dtype):
    page, blocked, errors = browser_page
    start = time.perf_counter()
    translations = translate_on_page(page, dtype)
    elapsed = time.perf_counter() - start
    assert translations == list(reference_translations(dtype, exact_int8=True)), f"after {elapsed:.1f} s"
    assert errors == []
    assert blocked == [], f"the page tried to reach other hosts: {blocked}"
    screenshot = os.environ.get(SCREENSHOT_VARIABLE)
    if screenshot and dtype == "fp32":
        page.screenshot(path=screenshot, full_page=True)


@requires_chromium
def test_nothing_left_the_machine(browser_page):
    """After both translations: no request to any host but the page's server was even attempted."""
    page, blocked, errors = browser_page
    assert blocked == []
    assert errors == []
    origins = page.evaluate("performance.getEntriesByType('resource').map(e => new URL(e.name).origin)")
    assert origins and set(origins) <= {page.evaluate("location.origin")}, origins
