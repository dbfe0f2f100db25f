"""A live `vt-serve` for tests: the tiny ONNX export served by uvicorn on a free loopback port, in a thread of the test
process or in a subprocess (for signals), and a translator wrapper that makes batches slow on purpose."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.serve_load import wait_ready
from tests.onnx_helpers import trained_export_dir
from vanilla_transformer_ort.serve.app import create_app
from vanilla_transformer_ort.serve.models import parse_model_spec
from vanilla_transformer_ort.serve.service import TranslationService, load_translators
from vanilla_transformer_ort.serve.settings import ServeSettings

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tiny_spec(folder=None):
    return parse_model_spec(f"en-de={folder or trained_export_dir()}")


class SlowTranslator:
    """An `OrtTranslator` whose every batch takes at least `delay` seconds more (sleeping releases the GIL, like
    onnxruntime's kernels do): makes queues, timeouts and in-flight requests observable."""

    def __init__(self, translator, delay: float):
        self._translator = translator
        self.delay = delay
        self.batches: list[int] = []

    def __getattr__(self, name):
        return getattr(self._translator, name)

    def generate(self, input_ids, attention_mask=None, **options):
        self.batches.append(len(input_ids))
        time.sleep(self.delay)
        return self._translator.generate(input_ids, attention_mask, **options)


def slow_loader(delay: float):
    def load(spec, settings):
        return [SlowTranslator(t, delay) for t in load_translators(spec, settings)]

    return load


def make_service(delay: float | None = None, folder=None, **settings) -> TranslationService:
    """A service of the tiny export; one session in a thread of this process unless `settings` say otherwise.
    `delay`: each batch's `generate` sleeps that long first, so request-level batches are served (step-level
    sessions do not call `generate`) unless `settings` ask for step-level batching."""
    settings = {"threads": 1, "sessions": 1, "session_workers": "thread", **settings}
    if delay:
        settings.setdefault("step_batching", False)
    load = slow_loader(delay) if delay else load_translators
    return TranslationService([tiny_spec(folder)], ServeSettings(**settings), load=load)


@contextlib.contextmanager
def live_server(service: TranslationService):
    """uvicorn serving `service` in a thread; yields the base URL."""
    import uvicorn

    port = free_port()
    config = uvicorn.Config(create_app(service), host="127.0.0.1", port=port, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    wait_ready(url)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def serve_process(*args: str) -> tuple[subprocess.Popen, str]:
    """`python -m vanilla_transformer_ort.serve ARGS --port P` as a subprocess; (process, base URL)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'runtime'}"}  # this checkout's runtime
    process = subprocess.Popen(
        [sys.executable, "-m", "vanilla_transformer_ort.serve", *args, "--port", str(port), "--threads", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    return process, f"http://127.0.0.1:{port}"


def run_app(service, scenario):
    """`scenario(client, app)` against the app in this process, its lifespan included."""
    import httpx

    app = create_app(service)

    async def main():
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://serve.test", timeout=60) as client:
                return await scenario(client, app)

    return asyncio.run(main())
