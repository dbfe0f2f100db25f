"""Serve the browser example and one export in the standard layout on localhost; standard library only.

    python examples/browser/serve.py --model OUT [--port 8000]

OUT is a folder written by `vt-export-onnx --layout optimum` (config.json, tokenizer.json, onnx/encoder_model.onnx,
onnx/decoder_model_merged.onnx, and with int8 their *_quantized.onnx siblings). transformers.js comes from the
version pinned in tests/js/package-lock.json, installed once with `npm ci` into
`${XDG_CACHE_HOME:-~/.cache}/vanilla-transformer/js/` (tests/js/npm_cache.py); its browser files are served from
there, so the page loads nothing from any other host.
"""

from __future__ import annotations

import argparse
import http.server
import json
import re
import sys
from functools import partial
from pathlib import Path
from urllib.parse import unquote, urlsplit

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests" / "js"))
import npm_cache  # noqa: E402  (tests/js/npm_cache.py: the pinned transformers.js, installed once)

PAGE_FILES = ("index.html", "app.js")
# What transformers.js reads for each dtype: the encoder and the merged decoder (one graph for every step).
GRAPHS = {
    "fp32": ("onnx/encoder_model.onnx", "onnx/decoder_model_merged.onnx"),
    "q8": ("onnx/encoder_model_quantized.onnx", "onnx/decoder_model_merged_quantized.onnx"),
}
REQUIRED_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".json": "application/json",
    ".wasm": "application/wasm",  # WebAssembly.instantiateStreaming requires it
    ".onnx": "application/octet-stream",
    ".data": "application/octet-stream",
}


class UserError(ValueError):
    """A mistake on the command line; printed as one line, exit status 2."""


def model_id(folder: Path) -> str:
    """A name transformers.js accepts as a model id (letters, digits, `_`, `.`, `-`; no `..` or `--`)."""
    name = re.sub(r"-{2,}", "-", re.sub(r"[^\w.-]", "-", folder.name)).strip(".-")[:96]
    return name.replace("..", ".") or "model"


def check_model(folder: Path) -> list[str]:
    """The dtypes `folder` can run with ("fp32", "q8"); raises UserError when it is not a standard-layout export."""
    if not folder.is_dir():
        raise UserError(f"--model {folder}: no such folder")
    missing = [name for name in REQUIRED_FILES if not (folder / name).is_file()]
    if missing:
        raise UserError(
            f"--model {folder} has no {', '.join(missing)}: export it with `vt-export-onnx --layout optimum`"
        )
    dtypes = [dtype for dtype, graphs in GRAPHS.items() if all((folder / graph).is_file() for graph in graphs)]
    if not dtypes:
        raise UserError(
            f"--model {folder} has neither {' and '.join(GRAPHS['fp32'])} nor their _quantized versions: "
            "export it with `vt-export-onnx --layout optimum`"
        )
    return dtypes


def build_routes(model: Path, dtypes: list[str], vendor: dict[str, Path]) -> tuple[dict[str, Path], bytes, str]:
    """URL path -> file for the page and the JavaScript, the models.json listing, and the model's URL prefix."""
    routes = {"/": HERE / "index.html", **{f"/{name}": HERE / name for name in PAGE_FILES}}
    routes.update({f"/vendor/{name}": path for name, path in vendor.items()})
    identifier = model_id(model)
    listing = json.dumps([{"id": identifier, "dtypes": dtypes}]).encode()
    return routes, listing, f"/models/{identifier}/"


class Handler(http.server.BaseHTTPRequestHandler):
    """GET/HEAD of the routes, models.json and the model's files; nothing else (no directory listings)."""

    server_version = "vanilla-transformer-browser-example"

    def __init__(self, *args, routes, listing, model_prefix, model_dir, quiet, **kwargs):
        self.routes, self.listing, self.model_prefix = routes, listing, model_prefix
        self.model_dir, self.quiet = model_dir, quiet
        super().__init__(*args, **kwargs)

    def resolve(self, url_path: str) -> Path | None:
        if url_path in self.routes:
            return self.routes[url_path]
        if url_path.startswith(self.model_prefix):
            path = (self.model_dir / url_path[len(self.model_prefix) :]).resolve()
            if path.is_file() and path.is_relative_to(self.model_dir):
                return path
        return None

    def send(self, body_length: int, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(body_length))
        self.send_header("Cache-Control", "no-cache")
        # Cross-origin isolation lets onnxruntime-web use WebAssembly threads (SharedArrayBuffer).
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        self.end_headers()

    def do_GET(self, head_only: bool = False) -> None:  # noqa: N802 (http.server's naming)
        url_path = unquote(urlsplit(self.path).path)
        if url_path == "/models.json":
            self.send(len(self.listing), CONTENT_TYPES[".json"])
            if not head_only:
                self.wfile.write(self.listing)
            return
        path = self.resolve(url_path)
        if path is None:
            self.send_error(404, "Not found")
            return
        content_type = CONTENT_TYPES.get(path.suffix, "application/octet-stream")
        self.send(path.stat().st_size, content_type)
        if not head_only:
            with path.open("rb") as source:
                while chunk := source.read(1 << 20):
                    self.wfile.write(chunk)

    def do_HEAD(self) -> None:  # noqa: N802
        self.do_GET(head_only=True)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (http.server's signature)
        if not self.quiet:
            super().log_message(format, *args)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Serve the browser translation example and an export in the standard layout on localhost.",
        epilog="Example: python examples/browser/serve.py --model exports/en-de-web --port 8000",
    )
    parser.add_argument("--model", required=True, type=Path, help="export folder (vt-export-onnx --layout optimum)")
    parser.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (0: any free port)")
    parser.add_argument("--quiet", action="store_true", help="do not log each request")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        model = args.model.resolve()
        dtypes = check_model(model)
        installed = npm_cache.ensure_installed(log=lambda line: print(line, file=sys.stderr, flush=True))
        routes, listing, prefix = build_routes(model, dtypes, npm_cache.browser_files(installed))
        handler = partial(
            Handler, routes=routes, listing=listing, model_prefix=prefix, model_dir=model, quiet=args.quiet
        )
        server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), handler)
    except (UserError, RuntimeError, OSError) as error:
        print(f"serve.py: error: {error}", file=sys.stderr)
        return 2
    host, port = server.server_address[:2]
    print(f"Serving {model} ({', '.join(dtypes)}) at http://{host}:{port}/  (Ctrl-C stops)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
