"""`vt-serve FOLDER [FOLDER ...]` (or `python -m vanilla_transformer_ort.serve`): serve ONNX export folders over
LibreTranslate's HTTP API, with batching across requests, metrics and graceful shutdown."""

from __future__ import annotations

import argparse
import logging
import sys

EXAMPLE = """example:
  vt-serve outputs/main_job/onnx --port 5000
  curl -s localhost:5000/translate -H 'Content-Type: application/json' \\
       -d '{"q": "File not found.", "source": "en", "target": "de"}'

Each FOLDER is an export folder (vt-export-onnx) whose manifest names its pair, or SRC-TGT=FOLDER (en-de=onnx/base).
Metrics: GET /metrics; OpenAPI: GET /docs. SIGTERM finishes accepted requests, then exits."""


def _flag(parser, name: str, **kwargs) -> None:
    """`--snake_case` with its `--kebab-case` spelling as an alias."""
    spellings = [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])
    parser.add_argument(*spellings, dest=name, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    from .settings import ServeSettings

    defaults = ServeSettings()
    parser = argparse.ArgumentParser(
        prog="vt-serve", description=__doc__, epilog=EXAMPLE, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "models", nargs="*", metavar="FOLDER", help="export folders to serve (FOLDER or SRC-TGT=FOLDER)"
    )
    _flag(parser, "model", action="append", default=[], metavar="FOLDER", help="another way to name a folder")
    _flag(parser, "host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for all)")
    _flag(parser, "port", type=int, default=5000, help="port (default 5000, LibreTranslate's)")
    _flag(parser, "sessions", type=int, default=defaults.sessions, help="onnxruntime sessions per model (default 1)")
    _flag(parser, "threads", type=int, default=None, help="threads per session (default: usable cores / sessions)")
    _flag(parser, "num_beams", type=int, default=None, help="beam size (default: the folder's generation_config)")
    _flag(parser, "max_new_tokens", type=int, default=None, help="longest translation of a segment, in tokens")
    _flag(parser, "provider", default="cpu", help="cpu, cuda or auto (default cpu)")
    _flag(parser, "char_limit", type=int, default=defaults.char_limit, help="characters per text (400 above)")
    _flag(parser, "max_texts", type=int, default=defaults.max_texts, help="texts per request (413 above)")
    _flag(parser, "max_body_bytes", type=int, default=defaults.max_body_bytes, help="request body size (413 above)")
    _flag(parser, "max_queue", type=int, default=defaults.max_queue, help="segments waiting (429 above)")
    _flag(parser, "request_timeout", type=float, default=defaults.request_timeout, help="seconds (503 after)")
    _flag(parser, "max_batch_tokens", type=int, default=defaults.max_batch_tokens, help="padded tokens a batch")
    _flag(parser, "max_batch_size", type=int, default=defaults.max_batch_size, help="segments a batch")
    _flag(parser, "max_wait_ms", type=float, default=defaults.max_wait_ms, help="longest wait to fill a batch")
    _flag(parser, "no_batching", action="store_true", help="never batch segments of different requests")
    _flag(parser, "api_keys", default=None, metavar="FILE", help="require api_key, one valid key a line")
    _flag(parser, "log_level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    return parser


def _version() -> str:
    from .app import _version

    return _version()


def _fail(message: str) -> None:
    print(f"vt-serve: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> None:
    """Parse the command line, check every folder, load the models and serve until SIGTERM or Ctrl-C."""
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as error:
        _fail(f"{error.name} is missing: install the serve extra, pip install 'vanilla-transformer-ort[cpu,serve]'")
    args = build_parser().parse_args(argv)
    try:
        server = build_server(args)
    except ValueError as error:
        if args.debug:
            raise
        _fail(str(error))
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server.run()


def build_server(args: argparse.Namespace):
    """A `uvicorn.Server` for the parsed arguments (ValueError for a bad folder or setting)."""
    import uvicorn

    from .app import create_app
    from .models import check_unique, parse_model_spec
    from .service import TranslationService
    from .settings import ServeSettings, read_api_keys

    models = list(args.models) + list(args.model)
    if not models:
        raise ValueError("no model to serve: pass an export folder (vt-serve FOLDER)")
    specs = [parse_model_spec(model) for model in models]
    check_unique(specs)
    settings = ServeSettings(
        char_limit=args.char_limit,
        max_texts=args.max_texts,
        max_body_bytes=args.max_body_bytes,
        max_queue=args.max_queue,
        request_timeout=args.request_timeout,
        max_batch_tokens=args.max_batch_tokens,
        max_batch_size=args.max_batch_size,
        max_wait_ms=args.max_wait_ms,
        batching=not args.no_batching,
        sessions=args.sessions,
        threads=args.threads,
        num_beams=args.num_beams,
        max_new_tokens=args.max_new_tokens,
        provider=args.provider,
        api_keys=read_api_keys(args.api_keys) if args.api_keys else frozenset(),
    )
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    service = TranslationService(specs, settings)
    config = uvicorn.Config(
        create_app(service),
        host=args.host,
        port=args.port,
        access_log=False,  # the app writes its own structured access log
        log_level=args.log_level,
        timeout_graceful_shutdown=settings.request_timeout + 5,
    )
    return draining_server(config, service)


def draining_server(config, service):
    """uvicorn's server that, on SIGTERM or SIGINT, first marks the service as draining: requests already accepted
    complete, new translations get 503 and `/ready` turns 503 while uvicorn stops listening and waits for them."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig, frame):
            service.begin_draining()
            super().handle_exit(sig, frame)

    return DrainingServer(config)
