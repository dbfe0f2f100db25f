"""`vt-serve`: LibreTranslate's API on the tiny export, batching across requests checked against single-request
translations by `OrtTranslator` (the oracle), every documented error, limits, API keys, metrics, shutdown, a real
LibreTranslate client (libretranslatepy) and an OpenAPI fuzzer (schemathesis) against a live server."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import shutil
import signal
import time

import httpx
import pytest

from tests import serve_helpers
from tests.onnx_helpers import SENTENCES, trained_export_dir, trained_int8_export_dir
from tests.serve_helpers import free_port, live_server, make_service, serve_process, tiny_spec, wait_ready
from vanilla_transformer_ort import OrtTranslator
from vanilla_transformer_ort.placeholder_syntax import ENTITY, MARKUP
from vanilla_transformer_ort.serve.app import create_app
from vanilla_transformer_ort.serve.batching import Overloaded
from vanilla_transformer_ort.serve.service import TranslationService, load_translators
from vanilla_transformer_ort.serve.settings import ServeSettings

# Texts for the load test: the tiny vocabulary, varied lengths, repeats, spaces and line breaks.
LOAD_TEXTS = [*SENTENCES, "a", "b c", "x y z 1 2", "k l m n o p", "  d e  ", "f g\nh i", "3 4 5 6", "a b c d"]


@pytest.fixture(scope="module")
def oracle() -> OrtTranslator:
    return OrtTranslator(trained_export_dir(), provider="cpu", intra_op_num_threads=1)


def single(oracle: OrtTranslator, text: str) -> str:
    """The oracle's translation of one text alone, cut into lines as the server cuts it. Placeholder protection
    copies a line without letters ("3 4 5") and never hands back an empty translation of one with letters."""

    def line_alone(line: str) -> str:
        stripped = line.strip()
        words = any(character.isalpha() for character in stripped)
        translation = (oracle.translate([stripped])[0].strip() if words else "") or stripped
        return line[: len(line) - len(line.lstrip())] + translation + line[len(line.rstrip()) :]

    return "\n".join(line_alone(line) if line.strip() else line for line in text.split("\n"))


def run_app(service, scenario):
    """Run `scenario(client)` against the app in this process (lifespan included)."""

    async def with_client(client, app):
        return await scenario(client)

    return serve_helpers.run_app(service, with_client)


def post(client, **fields):
    return client.post("/translate", json={"source": "en", "target": "de", **fields})


# -- the API ---------------------------------------------------------------------------------------------------


def test_json_form_string_and_list(oracle):
    async def scenario(client):
        as_json = await post(client, q="a b c")
        as_form = await client.post("/translate", data={"q": "a b c", "source": "en", "target": "de"})
        as_list = await post(client, q=SENTENCES)
        empty_list = await post(client, q=[])
        return as_json, as_form, as_list, empty_list

    as_json, as_form, as_list, empty_list = run_app(make_service(), scenario)
    assert as_json.status_code == as_form.status_code == as_list.status_code == 200
    assert as_json.json() == as_form.json() == {"translatedText": single(oracle, "a b c")}
    assert as_list.json() == {"translatedText": [single(oracle, s) for s in SENTENCES]}
    assert empty_list.json() == {"translatedText": []}


def test_auto_source_languages_and_alternatives():
    async def scenario(client):
        auto = await post(client, q=["a b", "c"], source="auto")
        languages = await client.get("/languages")
        alternatives = await post(client, q="a", alternatives=3)
        return auto, languages, alternatives

    auto, languages, alternatives = run_app(make_service(), scenario)
    assert auto.json()["detectedLanguage"] == [{"confidence": 100.0, "language": "en"}] * 2
    assert languages.json() == [
        {"code": "en", "name": "English", "targets": ["de"]},
        {"code": "de", "name": "German", "targets": []},
    ]
    assert alternatives.json()["alternatives"] == []


def test_empty_text_spaces_and_lines_are_kept(oracle):
    texts = ["", "   ", "a b\n\n  c d \n", "\r\nz\r\n"]

    async def scenario(client):
        return await post(client, q=texts)

    answer = run_app(make_service(), scenario).json()["translatedText"]
    assert answer[:2] == ["", "   "]
    assert answer[2] == f"{single(oracle, 'a b')}\n\n  {single(oracle, 'c d')} \n"
    assert answer[3] == f"\r\n{single(oracle, 'z')}\r\n"


def test_html_keeps_tags_entities_and_code(oracle):
    """The tiny model knows no tags: every attempt with the sentence's tags in it loses them, and the last retry
    translates the text between them piece by piece; the markup comes back as it was."""
    html = '<p class="x">a b</p> &amp; <b>c</b><code>q r</code><!-- z --><br/>'

    async def scenario(client):
        return await post(client, q=html, format="html")

    answer = run_app(make_service(), scenario).json()["translatedText"]
    a_b, c = single(oracle, "a b"), single(oracle, "c")
    assert answer == f'<p class="x">{a_b}</p> &amp; <b>{c}</b><code>q r</code><!-- z --><br/>'


# What a model keeps as it is in an HTML sentence: its tags and the entities it was given.
KEPT = re.compile(f"{MARKUP}|{ENTITY}")


def upper_words(text: str) -> str:
    """A "translation" that changes every word and copies the tags and entities: upper case outside them."""
    pieces, last = [], 0
    for match in KEPT.finditer(text):
        pieces += [text[last : match.start()].upper(), match.group()]
        last = match.end()
    return "".join(pieces) + text[last:].upper()


def html_answer(model, q, **settings):
    """`q` translated as HTML by a service whose model is `model(text) -> text`; (answer, texts the model got)."""
    service = make_service(**settings)
    sent: list[str] = []

    async def fake_model(pair, texts, admitted=False):
        sent.extend(texts)
        return [model(text) for text in texts]

    service._translate_segments = fake_model

    async def scenario(client):
        return await post(client, q=q, format="html")

    return run_app(service, scenario).json()["translatedText"], sent


def test_html_sentences_keep_their_inline_tags_around_the_right_words():
    """The model gets the sentence with its tags, and the tags come back where it put them."""
    source = "The file <b>report.txt</b> could not be saved."
    german = {source: "Die Datei <b>report.txt</b> konnte nicht gespeichert werden."}  # docs/serving.md's example
    answer, sent = html_answer(lambda text: german.get(text, text), f"<p>{source}</p>")
    assert sent == ["The file <b>report.txt</b> could not be saved."]
    assert answer == "<p>Die Datei <b>report.txt</b> konnte nicht gespeichert werden.</p>"


def test_html_tags_with_attributes_and_entities_move_with_their_words():
    """A model that breaks tags (drops < and >) and reverses the word order: the sentence is retried with its tags
    masked (%1, %2), and the link, attributes and all, comes back around the word it was around; `&amp;` reaches
    the model as `&` and the answer as `&amp;`."""
    html = 'Click <a href="/x?a=1&amp;b=2" title="Tom &amp; Jerry">here</a> to save &amp; exit.'

    def reverse_words(text: str) -> str:
        return " ".join(reversed(text.replace("<", "").replace(">", "").split(" ")))

    answer, sent = html_answer(reverse_words, html)
    assert sent[0] == 'Click <a href="/x?a=1&amp;b=2" title="Tom &amp; Jerry">here</a> to save & exit.'
    assert sent[1:] == ["Click %1here%2 to save & exit."]
    assert answer == 'exit. &amp; save to <a href="/x?a=1&amp;b=2" title="Tom &amp; Jerry">here</a> Click'


def test_html_entities_blocks_verbatim_elements_and_nesting():
    html = (
        "<h1>Caf&eacute; &quot;Le Monde&quot;</h1><ul><li>Run <code>ls -l</code> in <em>your <b>home</b> "
        "folder</em>.</li><li>x&nbsp;&lt;y&gt; &amp; z<br>next</li></ul>"
    )
    answer, sent = html_answer(upper_words, html)
    assert sent == [
        'Café "Le Monde"',
        'Run <code id="0"/> in <em>your <b>home</b> folder</em>.',
        "x&nbsp;&lt;y&gt; & z",
        "next",
    ]
    assert answer == (
        "<h1>CAFÉ &quot;LE MONDE&quot;</h1><ul><li>RUN <code>ls -l</code> IN <em>YOUR <b>HOME</b> "
        "FOLDER</em>.</li><li>X&nbsp;&lt;Y&gt; &amp; Z<br>NEXT</li></ul>"
    )
    assert html_answer(lambda text: text, html)[0] == html  # a model that echoes gives the page back as it was


def test_html_tags_crossed_by_the_model_are_retried():
    def crosses(text: str) -> str:
        return upper_words(text.replace("</i></b>", "</b></i>"))

    answer, sent = html_answer(crosses, "<p>Say <b>hello <i>world</i></b> now</p>")
    assert sent == ["Say <b>hello <i>world</i></b> now", "Say %1hello %2world%3%4 now"]
    assert answer == "<p>SAY <b>HELLO <i>WORLD</i></b> NOW</p>"


def test_html_tags_are_protected_even_without_placeholder_protection():
    answer, _ = html_answer(str.upper, "<p>a <b>b</b> %s</p>", protect_placeholders=False)
    assert answer == "<p>A <b>B</b> %s</p>"  # <B> is not <b>: retried with masks


def test_html_with_the_tiny_model_keeps_every_tag_in_order(oracle):
    html = '<p>a <b>b c</b> d <a href="x">e <i>f</i></a> g.</p><p>h&amp;i <span>j</span></p>'

    async def scenario(client):
        return await post(client, q=html, format="html")

    answer = run_app(make_service(), scenario).json()["translatedText"]
    assert re.findall("<[^>]*>", answer) == re.findall("<[^>]*>", html)
    assert "&" not in re.sub(ENTITY, "", answer)  # what the model wrote is escaped


# -- batching --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "variant",
    ["fp32", "int8", "fp32 in 2 session processes", "fp32 step-level", "int8 step-level in 2 session processes"],
)
def test_concurrent_answers_equal_single_request_translations(oracle, variant):
    """40 clients at once, each text as its own request and a few as lists: every answer equals the oracle's
    translation of that text alone, and the requests really were batched together. The int8 export too: its
    activations are quantized per row, so a row's translation does not depend on the rows batched with it. And the
    server's default, each session in a process of its own; and step-level batching, where requests join the
    running decoder batch (few places, so that they also wait for one)."""
    requests = [[text] for text in LOAD_TEXTS * 2] + [LOAD_TEXTS[i : i + 3] for i in range(0, len(LOAD_TEXTS), 3)]
    folder = trained_int8_export_dir() if variant.startswith("int8") else None
    if folder is not None:
        oracle = OrtTranslator(folder, provider="cpu", intra_op_num_threads=1)
    processes = {"sessions": 2, "session_workers": "process"} if "process" in variant else {}
    steps = {"step_batching": True, "step_batch_size": 6} if "step-level" in variant else {"step_batching": False}
    service = make_service(max_wait_ms=20, folder=folder, **processes, **steps)

    async def scenario(client):
        answers = await asyncio.gather(*(post(client, q=texts) for texts in requests))
        metrics = (await client.get("/metrics")).text
        return answers, metrics

    answers, metrics = run_app(service, scenario)
    for texts, answer in zip(requests, answers, strict=True):
        assert answer.status_code == 200, answer.text
        assert answer.json()["translatedText"] == [single(oracle, t) for t in texts]
    if steps["step_batching"]:  # decoder steps ran several requests' rows together
        assert _metric(metrics, "vt_decoder_step_rows_total") > 2 * _metric(metrics, "vt_decoder_steps_total")
        return
    count = _metric(metrics, "vt_batch_size_count")
    segments = _metric(metrics, "vt_segments_translated_total")
    assert count < segments / 4, (count, segments)  # batches held several requests' segments


def test_an_idle_server_starts_a_request_at_once():
    """`max_wait_ms` is how long a batch may wait for company while another batch runs: with every session idle, a
    request starts at once instead of waiting for requests that are not coming."""
    service = make_service(max_wait_ms=3000)

    async def scenario(client):
        await post(client, q="a b")  # the first request warms the session up
        started = time.perf_counter()
        answer = await post(client, q="c d")
        return answer, time.perf_counter() - started

    answer, seconds = run_app(service, scenario)
    assert answer.status_code == 200 and seconds < 1.5, seconds


def test_batching_off_keeps_requests_apart():
    service = make_service(delay=0.05, batching=False, max_wait_ms=20)

    async def scenario(client):
        return await asyncio.gather(*(post(client, q=text) for text in LOAD_TEXTS[:6]))

    answers = run_app(service, scenario)
    assert all(answer.status_code == 200 for answer in answers)
    batches = service.pairs[("en", "de")].engine.translators[0].batches
    assert set(batches) == {1} and len(batches) >= 6  # retries of empty translations add batches of their own


def test_health_answers_fast_while_saturated():
    """Decoding runs in worker threads: the event loop answers /health within 50 ms under load."""
    service = make_service(delay=0.2, max_batch_size=2)

    async def scenario(client):
        load = [asyncio.create_task(post(client, q=text)) for text in LOAD_TEXTS]
        await asyncio.sleep(0.1)
        timings = []
        for _ in range(5):
            started = time.perf_counter()
            health = await client.get("/health")
            timings.append(time.perf_counter() - started)
            assert health.json() == {"status": "ok"}
            await asyncio.sleep(0.05)
        metrics = (await client.get("/metrics")).text
        await asyncio.gather(*load)
        return timings, metrics

    timings, metrics = run_app(service, scenario)
    assert max(timings) < 0.05, timings
    assert _metric(metrics, "vt_queue_depth") > 0  # the server was saturated while /health answered


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in metrics")


def test_metrics_are_prometheus_text():
    async def scenario(client):
        await post(client, q="a b")
        await post(client, q=3)
        return await client.get("/metrics")

    metrics = run_app(make_service(), scenario)
    assert metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    assert 'vt_requests_total{endpoint="/translate",status="200"} 1.0' in text
    assert 'vt_requests_total{endpoint="/translate",status="400"} 1.0' in text
    for name in ("vt_request_duration_seconds_bucket", "vt_batch_size_bucket", "vt_generated_tokens_total"):
        assert name in text
    assert _metric(text, "vt_queue_depth") == 0


# -- bad input: each gives its status and a one-line error, and the server keeps serving -------------------------


BAD_REQUESTS = {
    "empty body": (dict(content=b"", headers={"content-type": "application/json"}), 400, "not valid JSON"),
    "no body": (dict(), 400, "no body"),
    "wrong content type": (dict(content=b"q=a", headers={"content-type": "text/plain"}), 400, "content type"),
    "JSON not an object": (dict(json=["a"]), 400, "must be an object"),
    "q missing": (dict(json={"source": "en", "target": "de"}), 400, "missing q"),
    "q a number": (dict(json={"q": 3, "source": "en", "target": "de"}), 400, "string or a list"),
    "list with a non-string": (dict(json={"q": ["a", None], "source": "en", "target": "de"}), 400, "q[1]"),
    "1 MB of text": (dict(json={"q": "a " * 500_000, "source": "en", "target": "de"}), 400, "characters"),
    "10,000 texts": (dict(json={"q": ["a"] * 10_000, "source": "en", "target": "de"}), 413, "limit is 1000"),
    "body over the byte limit": (dict(json={"q": ["a b"] * 999, "source": "en" * 1_100_000}), 413, "bytes"),
    "unknown source": (dict(json={"q": "a", "source": "xx", "target": "de"}), 400, "xx-de is not served"),
    "unknown target": (dict(json={"q": "a", "source": "en", "target": "fr"}), 400, "not served"),
    "auto to unknown target": (dict(json={"q": "a", "source": "auto", "target": "fr"}), 400, "not served"),
    "format markdown": (dict(json={"q": "a", "source": "en", "target": "de", "format": "md"}), 400, "format"),
    "invalid UTF-8": (dict(content=b'{"q": "\xff"}', headers={"content-type": "application/json"}), 400, "UTF-8"),
    "invalid UTF-8 form": (
        dict(content=b"q=%FF&source=en&target=de", headers={"content-type": "application/x-www-form-urlencoded"}),
        400,
        "UTF-8",
    ),
    "bad alternatives": (dict(json={"q": "a", "source": "en", "target": "de", "alternatives": "x"}), 400, "alt"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_input_gets_its_status_and_one_line(case):
    kwargs, status, words = BAD_REQUESTS[case]

    async def scenario(client):
        bad = await client.post("/translate", **kwargs)
        good = await post(client, q="a b")
        return bad, good

    bad, good = run_app(make_service(), scenario)
    assert bad.status_code == status, bad.text
    error = bad.json()["error"]
    assert words in error and "\n" not in error and "Traceback" not in error
    assert good.status_code == 200


def test_malformed_html_is_translated_not_refused(oracle):
    async def scenario(client):
        return await post(client, q="<p <b>a b</i> & <", format="html")

    answer = run_app(make_service(), scenario)
    assert answer.status_code == 200
    assert answer.json()["translatedText"].startswith("<p <b>")


def test_unknown_paths_and_methods_answer_json_errors():
    async def scenario(client):
        return await client.get("/nope"), await client.get("/translate")

    missing, method = run_app(make_service(), scenario)
    assert (missing.status_code, method.status_code) == (404, 405)
    assert "error" in missing.json() and "error" in method.json()


def test_the_schema_is_served_and_no_page_that_needs_a_cdn():
    """FastAPI's /docs and /redoc pages load their scripts from a CDN (blank offline): not served; the schema is."""

    async def scenario(client):
        return [await client.get(path) for path in ("/docs", "/redoc", "/openapi.json")]

    docs, redoc, schema = run_app(make_service(), scenario)
    assert (docs.status_code, redoc.status_code) == (404, 404) and "error" in docs.json()
    assert schema.status_code == 200 and "/translate" in schema.json()["paths"]


def test_api_keys(tmp_path):
    async def scenario(client):
        return (
            await post(client, q="a"),
            await post(client, q="a", api_key="wrong"),
            await post(client, q="a", api_key="k2"),
            await client.post("/translate", data={"q": "a", "source": "en", "target": "de", "api_key": "k1"}),
        )

    none, wrong, right, form = run_app(make_service(api_keys=frozenset({"k1", "k2"})), scenario)
    assert (none.status_code, wrong.status_code) == (403, 403)
    assert "API key" in none.json()["error"] and wrong.json()["error"] == "Invalid API key"
    assert right.status_code == form.status_code == 200


def test_full_queue_answers_429_and_timeout_503():
    service = make_service(delay=0.3, max_queue=2, max_batch_size=1, request_timeout=0.5)

    async def scenario(client):
        first = asyncio.create_task(post(client, q="a b c"))  # running at once
        await asyncio.sleep(0.05)
        second = asyncio.create_task(post(client, q=["c", "d"]))  # queued behind the first
        await asyncio.sleep(0.05)
        full = await post(client, q=["e", "f", "g"])
        return full, await first, await second

    full, first, second = run_app(service, scenario)
    assert full.status_code == 429 and full.headers["retry-after"] == "1"
    assert first.status_code == 200  # 0.3 s; the second needs 0.9 s
    assert second.status_code == 503 and "within 0.5 s" in second.json()["error"]


def test_admission_control_refuses_the_excess_at_once_and_finishes_what_it_accepts():
    """At 0.3 s a segment (one session, one segment a batch) the service rate is about 3.3 segments/s: with
    max_queue_seconds 0.5, a request behind a queued segment would start 0.9 s later, so it is a 503 at once, with a
    Retry-After that covers the excess; the accepted requests are answered; a request that finds the queue empty is
    always admitted; /metrics counts the refusal and shows the expected wait. The placeholder retries of a request
    admitted before are not refused: admission is decided once a request."""
    service = make_service(delay=0.3, max_batch_size=1, max_queue_seconds=0.5, request_timeout=10)

    async def scenario(client):
        warm = await post(client, q="a")  # the first batch: the service rate is measured from here on
        first = asyncio.create_task(post(client, q="a b c"))  # running at once
        await asyncio.sleep(0.05)
        second = asyncio.create_task(post(client, q="c"))  # the queue was empty: admitted
        await asyncio.sleep(0.05)
        started = time.perf_counter()
        refused = await post(client, q=["e", "f"])
        refused_after = time.perf_counter() - started
        metrics = (await client.get("/metrics")).text
        # more work of an admitted request (its placeholder retries) is not refused at the same moment
        retried = await service._translate_segments(service.pairs[("en", "de")], ["e", "f"], admitted=True)
        return warm, refused, refused_after, await first, await second, metrics, retried

    warm, refused, refused_after, first, second, metrics, retried = run_app(service, scenario)
    assert len(retried) == 2
    assert warm.status_code == first.status_code == second.status_code == 200
    assert refused.status_code == 503 and "at capacity" in refused.json()["error"]
    assert refused.headers["retry-after"] == "1"  # ceil(0.9 s expected - 0.5 s allowed)
    assert refused_after < 0.1  # answered at once, not after a wait
    assert _metric(metrics, 'vt_rejected_requests_total{reason="overloaded"}') == 1
    assert _metric(metrics, "vt_expected_wait_seconds") >= 0


def test_the_started_server_freezes_what_it_loaded_out_of_the_collector():
    """`vt-serve`'s server, once started (the models loaded), moves what it holds out of the garbage collector's
    generations: a full collection under load then walks only the requests' own objects, not the whole process."""
    import gc

    import uvicorn

    from vanilla_transformer_ort.serve.cli import draining_server

    service = make_service()
    config = uvicorn.Config(create_app(service), host="127.0.0.1", port=free_port(), log_config=None)
    server = draining_server(config, service)

    async def serve() -> int:
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():  # a server that failed to start ends its task
            await asyncio.sleep(0.01)
        frozen = gc.get_freeze_count()
        server.should_exit = True
        await task
        return frozen

    gc.unfreeze()
    try:
        assert service.ready is False and asyncio.run(serve()) > 0
    finally:
        gc.unfreeze()


def test_step_level_admission_refuses_what_would_wait_too_long_for_a_place():
    """Step-level batching: at the rate the sessions answer while they have work (not the rate requests came at,
    which admission itself limits), a request whose segments would wait more than max_queue_seconds for a place in
    a decoder batch, behind those waiting already, is a 503 at once; one that finds a place is always admitted."""
    from vanilla_transformer_ort.serve.step_scheduling import StepScheduler

    class Sessions:
        translators = [object()]

    scheduler = StepScheduler(Sessions(), max_sentences=4, max_queue_seconds=1.0)
    assert scheduler.service_rate is None and scheduler.expected_wait(3) == 0  # nothing outstanding
    scheduler._outstanding[0] = 3
    assert scheduler.expected_wait(1) == 0  # a free place: no wait, even before a rate is measured
    assert scheduler.expected_wait(3) is None  # 2 would wait; no rate measured yet: only max_queue applies
    scheduler._answered.extend([(1, 0.5), (2, 1.0), (1, 0.5)])  # 4 segments answered in 2 busy seconds: 2/s
    assert scheduler.service_rate == pytest.approx(2.0)
    scheduler._outstanding[0] = 5  # 4 decoding, 1 waiting for a place
    assert scheduler.queue_depth == 1
    assert scheduler.expected_wait(1) == pytest.approx(1.0)  # 2 segments waiting at 2/s
    scheduler._outstanding[0] = 0
    assert scheduler.expected_wait(2) == 0  # nothing outstanding: no wait

    async def refused():
        await scheduler.start()
        scheduler._outstanding[0] = 3
        with pytest.raises(Overloaded) as error:
            scheduler.submit(["a b"] * 4)  # 3 of them would wait: 1.5 s at 2/s
        return error.value.retry_after

    assert asyncio.run(refused()) == 1  # ceil(1.5 s expected - 1 s allowed)


def test_the_service_rate_follows_the_batches():
    """The scheduler's rate estimate: sessions / smoothed seconds per segment, None before any batch."""
    from vanilla_transformer_ort.serve.batching import SERVICE_RATE_SMOOTHING, BatchScheduler

    class TwoSessions:
        translators = [object(), object()]

    scheduler = BatchScheduler(TwoSessions(), max_queue_seconds=1.0)
    assert scheduler.service_rate is None and scheduler.expected_wait(5) is None
    scheduler._measure(segments=4, seconds=2.0)  # 0.5 s a segment on each of 2 sessions: 4 segments/s
    assert scheduler.service_rate == pytest.approx(4.0)
    scheduler._measure(segments=1, seconds=1.5)
    per_segment = 0.5 + SERVICE_RATE_SMOOTHING * (1.5 - 0.5)
    assert scheduler.service_rate == pytest.approx(2 / per_segment)
    assert scheduler.expected_wait(3) == pytest.approx(3 * per_segment / 2)
    with pytest.raises(ValueError, match="max_queue_seconds must be > 0"):
        BatchScheduler(TwoSessions(), max_queue_seconds=0)


def test_a_client_that_goes_away_leaves_the_batch_to_the_others(oracle):
    service = make_service(delay=0.2, max_wait_ms=30)

    async def scenario(client):
        leaving = asyncio.create_task(post(client, q="a b c"))
        staying = asyncio.create_task(post(client, q="a b"))
        await asyncio.sleep(0.05)  # both queued or in the same batch
        leaving.cancel()
        answer = await staying
        after = await post(client, q="c")
        return answer, after

    answer, after = run_app(service, scenario)
    assert answer.json()["translatedText"] == single(oracle, "a b")
    assert after.json()["translatedText"] == single(oracle, "c")


def test_a_session_process_that_dies_fails_its_batch_with_503_and_is_replaced(oracle):
    """The session's process is killed during a batch: that request gets LibreTranslate's JSON 503 (retry), the
    server starts a new session process and the next request is translated."""
    service = make_service(delay=0.3, session_workers="process")

    async def scenario(client):
        doomed = asyncio.create_task(post(client, q="a b"))
        await asyncio.sleep(0.1)  # in its batch, which sleeps before handing the ids to the session process
        session = service.pairs[("en", "de")].engine.translators[0]
        first = session.pid
        os.kill(first, signal.SIGKILL)
        answer = await doomed
        return answer, await post(client, q="c"), first, session.pid

    answer, after, first, replaced = run_app(service, scenario)
    assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
    assert "session ended" in answer.json()["error"] and "\n" not in answer.json()["error"]
    assert after.json()["translatedText"] == single(oracle, "c") and replaced != first


def test_a_server_fault_is_a_json_500_without_a_stack_trace():
    class Broken:
        def __init__(self, translator):
            self._translator = translator

        def __getattr__(self, name):
            return getattr(self._translator, name)

        def generate(self, *args, **kwargs):
            raise ZeroDivisionError("a bug")

    settings = ServeSettings(threads=1, sessions=1, session_workers="thread", step_batching=False)  # `generate`
    service = TranslationService(
        [tiny_spec()], settings, load=lambda spec, s: [Broken(t) for t in load_translators(spec, s)]
    )
    app = create_app(service)

    async def main():
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://serve.test") as client:
                return await post(client, q="a b"), await client.get("/health")

    answer, health = asyncio.run(main())
    assert answer.status_code == 500
    assert answer.json() == {"error": "internal error (ZeroDivisionError); the server's log has the details"}
    assert health.status_code == 200


def test_requests_during_shutdown_are_refused_and_accepted_ones_finish(oracle):
    service = make_service(delay=0.3)

    async def scenario(client):
        accepted = asyncio.create_task(post(client, q="a b"))
        await asyncio.sleep(0.05)
        service.begin_draining()
        refused = await post(client, q="c")
        ready = await client.get("/ready")
        return await accepted, refused, ready

    accepted, refused, ready = run_app(service, scenario)
    assert accepted.json()["translatedText"] == single(oracle, "a b")
    assert refused.status_code == 503 and "shutting down" in refused.json()["error"]
    assert ready.status_code == 503


# -- the command and a live server ------------------------------------------------------------------------------


def test_a_folder_that_is_not_an_export_stops_the_server(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    process, _ = serve_process(f"en-de={tmp_path}")
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 2
    assert stderr.strip().count("\n") == 0 and str(tmp_path) in stderr and "encoder_model.onnx" in stderr


def test_step_batching_on_a_folder_of_an_older_format_stops_the_server(tmp_path):
    folder = tmp_path / "onnx"
    shutil.copytree(trained_export_dir(), folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "format_version": 2}))
    process, _ = serve_process(f"en-de={folder}", "--step_batching")
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 2
    assert stderr.strip().count("\n") == 0 and "format 3" in stderr and "vt-export-onnx" in stderr


def test_folder_without_languages_asks_for_the_pair(tmp_path):
    process, _ = serve_process(str(trained_export_dir()))
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 2 and "en-de=" in stderr


@pytest.mark.parametrize("scheduler", [[], ["--no_step_batching"]], ids=["step-level", "request-level"])
def test_sigterm_finishes_accepted_requests_and_refuses_new_ones(oracle, scheduler):
    """A live server in a subprocess, its session in a process of its own (the default), with step-level batching
    (the default) and request-level batches: a request in flight when SIGTERM arrives still gets its translation;
    then the port refuses connections and the process ends with status 0 and one line saying why. Every other line
    on stderr is a JSON access line or a `time level logger: message` line, uvicorn's own included."""
    texts = [" ".join(words) for words in itertools.islice(itertools.permutations("abcdefgh", 4), 1000)]
    one_at_a_time = ["--max_batch_size", "1", "--step_batch_size", "1"]
    process, url = serve_process(f"en-de={trained_export_dir()}", "--sessions", "1", *one_at_a_time, *scheduler)
    try:
        wait_ready(url, process=process)

        async def scenario():
            async with httpx.AsyncClient(base_url=url, timeout=60) as client:
                in_flight = asyncio.create_task(  # 1000 texts decoded one after the other
                    client.post("/translate", json={"q": texts, "source": "en", "target": "de"})
                )
                await asyncio.sleep(0.1)
                process.send_signal(signal.SIGTERM)
                signalled = time.perf_counter()
                answer = await in_flight
                return answer, time.perf_counter() - signalled

        answer, after_signal = asyncio.run(scenario())
        assert answer.status_code == 200
        assert after_signal > 0.02  # the request was still being translated when SIGTERM came
        assert answer.json()["translatedText"] == [single(oracle, text) for text in texts]
        assert process.wait(timeout=30) == 0
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/health", timeout=2)
        logs = process.stderr.read()
        access = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]  # the access log's lines
        assert any(entry["path"] == "/translate" and entry["status"] == 200 for entry in access), logs
        assert all(set(entry) == {"time", "method", "path", "status", "ms", "client"} for entry in access), access
        assert ".serve.access" not in logs  # no logger prefix: every access line is bare JSON
        assert "not installed: uvicorn falls back" not in logs  # the serve extra brings uvloop and httptools
        assert_documented_log_lines(logs, "SIGTERM")
        assert "Started server process" in logs and "Finished server process" in logs  # uvicorn's, in that format
    finally:
        process.kill()


# The server's messages as docs/serving.md gives them: `time level logger: message` (logging's default asctime).
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: \S")


def assert_documented_log_lines(logs: str, stopped_by: str) -> None:
    """Every line of a stopped server's stderr is an access line (a JSON object), a log line, or the last line
    saying which signal stopped it."""
    lines = logs.splitlines()
    assert lines[-1] == f"vt-serve: stopped on {stopped_by}", logs
    for line in lines[:-1]:
        if line.startswith("{"):
            assert isinstance(json.loads(line), dict), line
        else:
            assert LOG_LINE.match(line), line


def test_ctrl_c_stops_like_sigterm():
    """Ctrl-C (SIGINT) drains like SIGTERM: status 0, the same one line."""
    process, url = serve_process(f"en-de={trained_export_dir()}", "--sessions", "1")
    try:
        wait_ready(url, process=process)
        assert httpx.post(f"{url}/translate", json={"q": "a b", "source": "en", "target": "de"}).status_code == 200
        process.send_signal(signal.SIGINT)
        _, logs = process.communicate(timeout=30)
        assert process.returncode == 0, logs
        assert_documented_log_lines(logs, "SIGINT")
    finally:
        process.kill()


def test_missing_uvloop_or_httptools_is_named(monkeypatch):
    """Without them uvicorn still serves, more slowly; `vt-serve` warns at start, naming what is missing (uvloop is
    not asked for on Windows)."""
    import importlib.util

    from vanilla_transformer_ort.serve import cli

    assert cli.missing_fast_io() == []  # installed here by the serve extra
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvloop" else real(name, *a))
    assert cli.missing_fast_io("linux") == ["uvloop"]
    assert cli.missing_fast_io("win32") == []
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert cli.missing_fast_io("linux") == ["uvloop", "httptools"]


def test_libretranslatepy_client_unmodified(oracle):
    from libretranslatepy import LibreTranslateAPI

    with live_server(make_service()) as url:
        client = LibreTranslateAPI(url)
        assert client.translate("a b c", "en", "de") == single(oracle, "a b c")
        assert client.translate("q r s t", "auto", "de") == single(oracle, "q r s t")
        assert [language["code"] for language in client.languages()] == ["en", "de"]


def test_libretranslatepy_with_api_key(oracle):
    from urllib.error import HTTPError

    from libretranslatepy import LibreTranslateAPI

    with live_server(make_service(api_keys=frozenset({"secret"}))) as url:
        assert LibreTranslateAPI(url, api_key="secret").translate("a b c", "en", "de") == single(oracle, "a b c")
        with pytest.raises(HTTPError) as refused:
            LibreTranslateAPI(url, api_key="nope").translate("a", "en", "de")
        assert refused.value.code == 403


def test_openapi_fuzzing_finds_no_server_error_and_no_schema_violation():
    """schemathesis generates requests from the served OpenAPI schema (valid and invalid ones) against a live
    server: no 5xx, every status documented, every answer valid against its schema, invalid data rejected.

    Not checked: that every schema-valid request succeeds. The schema lists the served languages for `source` and
    `target`, but cannot say which of their combinations is a served pair (de-de is valid JSON and a 400)."""
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from schemathesis.checks import positive_data_acceptance

    with live_server(make_service(max_new_tokens=4)) as url:
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
        failures = []
        for result in schema.get_all_operations():
            operation = result.ok()

            @settings(
                max_examples=25,
                deadline=None,
                derandomize=True,
                database=None,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=operation.as_strategy())
            def check(case):
                case.call_and_validate(base_url=url, excluded_checks=[positive_data_acceptance])

            try:
                check()
            except Exception as error:  # collect every operation's failure, then report them together
                failures.append(f"{operation.method.upper()} {operation.path}: {error}")
        assert not failures, "\n".join(failures)


def test_pair_from_the_manifest_and_from_training_info(tmp_path):
    import shutil

    from vanilla_transformer.export.onnx.export import _languages
    from vanilla_transformer_ort.serve.models import parse_model_spec

    folder = tmp_path / "onnx"
    shutil.copytree(trained_export_dir(), folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "source_lang": "en", "target_lang": "fr"}))
    spec = parse_model_spec(folder)
    assert (spec.source, spec.target, spec.folder) == ("en", "fr", folder)
    assert parse_model_spec(f"en-fr={folder}").pair == "en-fr"
    assert parse_model_spec(f"en-fr_CA={folder}").pair == "en-fr_CA"  # a regional variant of the folder's target
    with pytest.raises(ValueError, match=r"^de-en=.*translates en→fr .*name the pair it was trained for, en-fr="):
        parse_model_spec(f"de-en={folder}")  # a pair the folder was not trained for
    with pytest.raises(ValueError, match=r"'xx' is not a language pair; write SRC-TGT=FOLDER"):
        parse_model_spec(f"xx={folder}")
    plain = tmp_path / "plain"
    shutil.copytree(trained_export_dir(), plain)
    (plain / "manifest.json").write_text(json.dumps({k: v for k, v in manifest.items() if "lang" not in k}))
    assert parse_model_spec(f"de-en={plain}").pair == "de-en"  # a folder that names no pair: the command line's
    (tmp_path / "training_info.json").write_text(json.dumps({"source_lang": "en", "target_lang": "de", "steps": 3}))
    assert _languages(tmp_path) == {"source_lang": "en", "target_lang": "de"}
    assert _languages(tmp_path / "missing") == {}


def test_placeholders_survive_a_model_that_drops_them():
    """Every text goes through placeholder protection: a model (here a fake, the record of what was sent) that
    mangles a placeholder triggers the retries (masked, then piece by piece), and the answers keep them all."""
    service = make_service()
    sent: list[list[str]] = []

    async def fake_model(pair, texts, admitted=False):
        sent.append(list(texts))
        # "translates" by upper-casing (%s becomes %S: a broken placeholder); drops the mask %2
        return [text.upper().replace("%2", "") for text in texts]

    service._translate_segments = fake_model
    texts = ["Cannot open %s", "Copy %s to %s", "Visit <b>%(site)s</b> now", "%d%%", "plain words"]

    async def scenario(client):
        return await post(client, q=texts)

    answer = run_app(service, scenario).json()["translatedText"]
    assert answer[0] == "CANNOT OPEN %s"  # %S is not %s: retried masked as %1, restored
    assert answer[1] == "COPY %s TO %s"  # %2 lost too: retried masked as {0} {1}
    assert answer[2] == "VISIT <b>%(site)s</b> NOW"
    assert answer[3] == "%d%%"  # nothing to translate: copied
    assert answer[4] == "PLAIN WORDS"
    assert "Copy %s to %s" in sent[0] and "%d%%" not in sent[0]  # first as it is
    assert ["Copy %1 to %2"] in [[t for t in batch if t.startswith("Copy")] for batch in sent]


def test_without_protection_placeholders_are_the_model_s_business():
    service = make_service(protect_placeholders=False)

    async def fake_model(pair, texts, admitted=False):
        return [text.upper() for text in texts]

    service._translate_segments = fake_model

    async def scenario(client):
        return await post(client, q="Copy %s to %s")

    assert run_app(service, scenario).json()["translatedText"] == "COPY %S TO %S"


def test_serves_where_torch_and_transformers_are_blocked(tmp_path, oracle):
    """The server is part of the torch-free runtime: only runtime/ on the path, torch and transformers refused."""
    import os
    import subprocess
    import sys

    from tests.test_runtime_distribution import BLOCK_IMPORTS, RUNTIME

    code = BLOCK_IMPORTS + (
        "import asyncio, httpx\n"
        "from vanilla_transformer_ort.serve import build_app\n"
        f"app = build_app(['en-de={trained_export_dir()}'])\n"
        "async def main():\n"
        "    async with app.router.lifespan_context(app):\n"
        "        transport = httpx.ASGITransport(app=app)\n"
        "        async with httpx.AsyncClient(transport=transport, base_url='http://t') as client:\n"
        "            answer = await client.post('/translate', json={'q': 'a b c', 'source': 'en', 'target': 'de'})\n"
        "            print(answer.json()['translatedText'])\n"
        "asyncio.run(main())\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'vanilla_transformer')]\n"
        "assert not loaded, loaded\n"
    )
    env = {**os.environ, "PYTHONPATH": str(RUNTIME)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == single(oracle, "a b c")


def test_a_batch_dependent_int8_folder_is_served_with_a_warning(caplog):
    """An int8 export with one activation range per tensor answers depending on its batch: batching it warns and
    names the fix; the default per-row export and batching off do not warn."""
    from vanilla_transformer_ort.serve.models import batch_dependent
    from vanilla_transformer_ort.serve.service import load_translators
    from vanilla_transformer_ort.serve.settings import ServeSettings

    per_tensor, per_row = trained_int8_export_dir("tensor"), trained_int8_export_dir()
    assert batch_dependent(per_tensor) and not batch_dependent(per_row) and not batch_dependent(trained_export_dir())
    cases = [(per_tensor, True, True), (per_row, True, False), (per_tensor, False, False)]
    for folder, batching, warns in cases:
        caplog.clear()
        with caplog.at_level("WARNING", logger="vanilla_transformer_ort.serve.service"):
            sessions = load_translators(tiny_spec(folder), ServeSettings(sessions=1, threads=1, batching=batching))
        for session in sessions:
            session.close()
        assert ("--no_batching" in caplog.text) == warns, (folder, batching)


def test_a_folder_of_another_layout_is_named(tmp_path):
    """vt-serve given a PyTorch model folder or a standard-layout export says which it is and the command to run."""
    from tests.onnx_helpers import trained_model_dir
    from vanilla_transformer_ort.serve.models import parse_model_spec

    with pytest.raises(ValueError, match=r"is a PyTorch model folder .*vt-export-onnx --model MODEL --output OUT"):
        parse_model_spec(f"en-de={trained_model_dir()}")
    standard = tmp_path / "standard"
    (standard / "onnx").mkdir(parents=True)
    (standard / "config.json").write_text("{}")
    (standard / "onnx" / "decoder_model_merged.onnx").write_bytes(b"")
    with pytest.raises(ValueError, match=r"standard layout of Optimum and transformers.js"):
        parse_model_spec(f"en-de={standard}")
