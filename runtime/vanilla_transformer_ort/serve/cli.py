"""`vt-serve FOLDER [FOLDER ...]` (or `python -m vanilla_transformer_ort.serve`): serve ONNX export folders over
LibreTranslate's HTTP API, with batching across requests, metrics and graceful shutdown."""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import logging
import signal
import sys

PROG = "vt-serve"
EXAMPLE = """\
vt-serve outputs/main_job/onnx --port 5000
curl -s localhost:5000/translate -H 'Content-Type: application/json' \\
     -d '{"q": "File not found.", "source": "en", "target": "de"}'
"""
DESCRIPTION = (
    __doc__
    + """
Each FOLDER is an export folder (vt-export-onnx) whose manifest names its pair, or SRC-TGT=FOLDER (en-de=onnx/base).
Metrics: GET /metrics; OpenAPI schema: GET /openapi.json. SIGTERM or Ctrl-C finishes accepted requests, then exits
with status 0."""
)


def build_parser():
    from .. import __version__
    from ..cli_common import make_parser, positive_int
    from .settings import SESSION_WORKERS, ServeSettings

    defaults = ServeSettings()
    parser = make_parser(PROG, DESCRIPTION, EXAMPLE, __version__)
    parser.add_argument("models", nargs="*", metavar="FOLDER", help="export folders (FOLDER or SRC-TGT=FOLDER)")
    parser.add_argument("--model", action="append", default=[], metavar="FOLDER", help="another folder to serve")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for all)")
    parser.add_argument("--port", type=int, default=5000, help="port (default 5000, LibreTranslate's)")
    parser.add_argument(
        "--sessions",
        type=positive_int,
        default=defaults.sessions,
        help="onnxruntime sessions per model, each runs a batch (default 2, or 1 on one core)",
    )
    parser.add_argument(
        "--threads", type=positive_int, default=None, help="threads a session (default: usable cores / sessions)"
    )
    parser.add_argument(
        "--session_workers",
        choices=SESSION_WORKERS,
        default=defaults.session_workers,
        help="run each session in a process of its own (default; no session waits for another's Python) or in a "
        "thread of the server (less memory)",
    )
    parser.add_argument("--num_beams", type=positive_int, default=None, help="beam size (default: the folder's)")
    parser.add_argument("--max_new_tokens", type=positive_int, default=None, help="longest translation, in tokens")
    parser.add_argument("--provider", default="cpu", help="cpu, cuda or auto (default cpu)")
    limits = [  # (flag, type, help): each a ServeSettings field of the same name, its default shown
        ("char_limit", positive_int, "characters a text; longer is a 400"),
        ("max_texts", positive_int, "texts a request; more is a 413"),
        ("max_body_bytes", positive_int, "request body bytes; more is a 413"),
        ("max_queue", positive_int, "segments waiting; more is a 429"),
        ("request_timeout", float, "seconds before a 503"),
        ("max_queue_seconds", float, "queued work, in seconds at the measured rate, beyond which a request is a 503"),
        ("max_batch_tokens", positive_int, "padded tokens a batch"),
        ("max_batch_size", positive_int, "segments a batch"),
        ("step_batch_size", positive_int, "sources a session decodes at once with step-level batching"),
        ("max_wait_ms", float, "longest wait to fill a batch while another runs"),
        ("max_file_bytes", positive_int, "bytes a file sent to /translate_file; more is a 413"),
        ("download_expiry", float, "seconds a translated file can be downloaded, then it is deleted"),
        ("frontend_timeout", int, "milliseconds the web page waits after typing before it translates"),
    ]
    for name, kind, text in limits:
        parser.add_argument(
            f"--{name}", type=kind, default=getattr(defaults, name), help=f"{text} (default %(default)s)"
        )
    parser.add_argument("--no_batching", action="store_true", help="never batch different requests together")
    steps = parser.add_mutually_exclusive_group()
    steps.add_argument(
        "--step_batching",
        action="store_true",
        default=None,
        help="step-level batching (the default where the folder allows it: export format 3, CPU): a request's "
        "segments join the running decoder batch at its next step and leave it when they finish, up to "
        "--step_batch_size sources a session; given, a folder that does not allow it is an error",
    )
    steps.add_argument(
        "--no_step_batching",
        dest="step_batching",
        action="store_false",
        help="request-level batching: a batch runs until its longest segment is done",
    )
    parser.add_argument(
        "--no_files_translation", action="store_true", help="turn off /translate_file (403) and the page's file tab"
    )
    parser.add_argument(
        "--no_protect_placeholders",
        action="store_true",
        help="translate %%s, {0}, <b> ... as plain text (unsafe; format=html still keeps its tags)",
    )
    parser.add_argument("--api_keys", default=None, metavar="FILE", help="require api_key: valid keys, one a line")
    parser.add_argument("--log_level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument(
        "--ray_replicas", type=positive_int, default=None, help="serve N replicas with Ray Serve (the ray extra)"
    )
    parser.add_argument("--ray_address", default=None, help="with --ray_replicas: a running cluster ('auto')")
    parser.add_argument("--ray_cpus_per_replica", type=float, default=1.0, help="CPUs Ray reserves a replica")
    return parser


def serve_command(argv: list[str]) -> None:
    """Parse `argv`, check every folder, load the models and serve until SIGTERM or Ctrl-C."""
    from ..cli_common import UserError

    args = build_parser().parse_args(argv)  # first: --help needs none of the serve extra
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as error:
        raise UserError(
            f"{error.name} is missing: install the serve extra; from a checkout, pip install './runtime[cpu,serve]' "
            "(or pip install -e '.[onnx,serve]' with the full package)"
        ) from None
    if args.ray_replicas:
        run_on_ray(args)
        return
    server = build_server(args)
    configure_logging(args.log_level)
    missing = missing_fast_io()
    if missing:
        logging.getLogger(__name__).warning(
            "%s not installed: uvicorn falls back to asyncio's event loop and its pure-Python HTTP parser, which "
            "serve fewer sentences/s; pip install 'uvicorn[standard]' (the serve extra installs it)",
            " and ".join(missing),
        )
    server.run()
    if server.stopped_by is not None:
        print(f"{PROG}: stopped on {server.stopped_by}", file=sys.stderr)


def configure_logging(level: str) -> None:
    """Server messages, uvicorn's included, as `time level logger: message`; the access log as bare JSON lines
    (`configure_access_log`)."""
    from .app import configure_access_log

    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    configure_access_log(level=logging.getLevelName(level.upper()))


def missing_fast_io(platform: str = sys.platform) -> list[str]:
    """Which of uvloop and httptools, the event loop and HTTP parser uvicorn picks when installed, are missing
    (uvloop is not counted on Windows, where it does not run)."""
    wanted = ["httptools"] if platform == "win32" else ["uvloop", "httptools"]
    return [name for name in wanted if importlib.util.find_spec(name) is None]


def main(argv: list[str] | None = None) -> int:
    """The `vt-serve` console script: one-line errors with exit status 2 (`--debug` for the traceback)."""
    from ..cli_common import run_cli

    return run_cli(serve_command, argv, prog=PROG)


def run_on_ray(args: argparse.Namespace) -> None:
    """The same app as `args.ray_replicas` Ray Serve replicas on `--host:--port`, until Ctrl-C."""
    from ..cli_common import UserError

    try:
        import ray  # noqa: F401
    except ImportError:
        raise UserError(
            "ray is missing: install the ray extra; from a checkout, pip install './runtime[cpu,serve,ray]' (or pip "
            "install -e '.[onnx,serve,ray]' with the full package)"
        ) from None
    from .ray_serve import run_ray_serve

    configure_logging(args.log_level)
    models = list(args.models) + list(args.model)
    if not models:
        raise UserError("no model to serve: pass an export folder (vt-serve FOLDER)")
    run_ray_serve(
        models,
        settings_from_args(args),
        replicas=args.ray_replicas,
        host=args.host,
        port=args.port,
        address=args.ray_address,
        cpus_per_replica=args.ray_cpus_per_replica,
    )


def settings_from_args(args: argparse.Namespace):
    from .settings import ServeSettings, read_api_keys

    return ServeSettings(
        char_limit=args.char_limit,
        max_texts=args.max_texts,
        max_body_bytes=args.max_body_bytes,
        max_queue=args.max_queue,
        request_timeout=args.request_timeout,
        max_queue_seconds=args.max_queue_seconds,
        max_batch_tokens=args.max_batch_tokens,
        max_batch_size=args.max_batch_size,
        max_wait_ms=args.max_wait_ms,
        max_file_bytes=args.max_file_bytes,
        download_expiry=args.download_expiry,
        frontend_timeout=args.frontend_timeout,
        files_translation=not args.no_files_translation,
        batching=not args.no_batching,
        step_batching=args.step_batching,
        protect_placeholders=not args.no_protect_placeholders,
        sessions=args.sessions,
        threads=args.threads,
        session_workers=args.session_workers,
        num_beams=args.num_beams,
        max_new_tokens=args.max_new_tokens,
        provider=args.provider,
        api_keys=read_api_keys(args.api_keys) if args.api_keys else frozenset(),
    )


def build_server(args: argparse.Namespace):
    """A `uvicorn.Server` for the parsed arguments (ValueError for a bad folder or setting)."""
    import uvicorn

    from ..contract import EXPORT_AGAIN
    from .app import create_app
    from .models import check_unique, parse_model_spec
    from .service import TranslationService

    models = list(args.models) + list(args.model)
    if not models:
        raise ValueError("no model to serve: pass an export folder (vt-serve FOLDER)")
    specs = [parse_model_spec(model) for model in models]
    check_unique(specs)
    settings = settings_from_args(args)
    for spec in specs if settings.step_batching else ():
        if not spec.export_folder.has_per_row_lengths:
            raise ValueError(
                f"{spec.folder}: --step_batching needs an export of format 3 (the in-place decoder with per-row "
                f"lengths); {EXPORT_AGAIN}"
            )
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    service = TranslationService(specs, settings)
    config = uvicorn.Config(
        create_app(service),
        host=args.host,
        port=args.port,
        access_log=False,  # the app writes its own structured access log
        log_config=None,  # uvicorn's messages go to the root logger, in this server's format (`configure_logging`)
        log_level=args.log_level,
        timeout_graceful_shutdown=settings.request_timeout + 5,
    )
    return draining_server(config, service)


def draining_server(config, service):
    """uvicorn's server that, on SIGTERM or SIGINT, first marks the service as draining: requests already accepted
    complete, new translations get 503 and `/ready` turns 503 while uvicorn stops listening and waits for them.
    After that graceful stop its `stopped_by` names the signal, and `run` returns: uvicorn would raise the signal
    again, ending the process with status 143 (SIGTERM) or a KeyboardInterrupt (Ctrl-C). A second Ctrl-C (uvicorn's
    forced exit, requests cut short) is still raised again. Once started, it freezes what it loaded out of the
    garbage collector's generations (`gc.freeze`)."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        stopped_by: str | None = None

        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            # What is loaded by now lives as long as the server: out of the collector's reach, a full collection
            # walks only the requests' own objects instead of pausing the event loop (and the refusals it answers).
            gc.freeze()

        def handle_exit(self, sig, frame):
            service.begin_draining()
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self):
            with super().capture_signals():
                yield
                captured = getattr(self, "_captured_signals", [])  # what uvicorn raises again once it has stopped
                if captured and not self.force_exit:
                    self.stopped_by = signal.Signals(captured[0]).name
                    captured.clear()

    return DrainingServer(config)
