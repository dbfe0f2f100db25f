"""`vt-translate-onnx --model FOLDER [TEXT ...]` (or `python -m vanilla_transformer_ort`): translate with an export
folder, streaming a file or stdin of any length when no TEXT is given (`bulk.py`).

The older spelling with the folder first, `vt-translate-onnx FOLDER [TEXT ...]`, still works.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from . import __version__
from .bulk import DEFAULT_CHUNK_SIZE, Progress, count_lines, is_terminal, read_lines, translate_lines
from .cli_common import UserError, make_parser, positive_int, run_cli

PROG = "vt-translate-onnx"
DESCRIPTION = """Translate text with an ONNX export folder (written by vt-export-onnx), without torch.

Sentences come from the command line, from --input FILE or from stdin, one per line; translations go to stdout or
--output FILE, one per line in input order. Files of any length stream through in chunks of --chunk_size lines
(bounded memory); --workers N runs N onnxruntime processes of --threads threads each. A blank input line gives an
empty output line, so the output always has as many lines as the input."""
EXAMPLE = """vt-translate-onnx --model onnx/base "Hello world." --num_beams 4 --threads 2
vt-translate-onnx --model onnx/base --input news.en --output news.de --workers 2 --progress"""


def build_parser() -> argparse.ArgumentParser:
    """The command's flags (each also spelled with dashes: `--num-beams`)."""
    parser = make_parser(PROG, DESCRIPTION, EXAMPLE, __version__)
    parser.add_argument("text", nargs="*", help="sentences to translate (default: --input or stdin, one per line)")
    parser.add_argument("--model", metavar="FOLDER", help="export folder (older spelling: the first positional)")
    parser.add_argument("--input", metavar="FILE", help="UTF-8 file of sentences, one per line (default: stdin)")
    parser.add_argument("--output", metavar="FILE", help="file to write the translations to (default: stdout)")
    parser.add_argument("--provider", default="auto", help="auto, cpu or cuda (default: auto)")
    parser.add_argument("--threads", type=positive_int, default=1, help="intra-op threads per worker (default: 1)")
    parser.add_argument("--workers", type=positive_int, default=1, help="onnxruntime processes (default: 1)")
    parser.add_argument("--batch_size", type=positive_int, default=32, help="sentences per model call (default: 32)")
    parser.add_argument(
        "--chunk_size",
        type=positive_int,
        default=DEFAULT_CHUNK_SIZE,
        help=f"lines read, sorted by length and batched together (default: {DEFAULT_CHUNK_SIZE})",
    )
    parser.add_argument("--num_beams", type=positive_int, default=None, help="beam size (default: the folder's)")
    parser.add_argument("--max_new_tokens", type=positive_int, default=None, help="default: the folder's")
    parser.add_argument("--length_penalty", type=float, default=None, help="default: the folder's")
    parser.add_argument("--progress", action="store_true", help="show progress on stderr (default: on a terminal)")
    return parser


@contextlib.contextmanager
def open_input(path: str | None, texts: list[str]) -> Iterator[tuple[Iterator[str], int | None]]:
    """The sentences (from TEXT arguments, `path` or stdin) and their number when known without reading them."""
    if texts:
        yield iter(texts), len(texts)
    elif path is not None:
        if not Path(path).is_file():
            raise UserError(f"--input {path} does not exist or is not a file; pass a text file, one sentence per line")
        with open(path, "rb") as handle:
            yield read_lines(handle, path), None
    else:
        yield read_lines(getattr(sys.stdin, "buffer", sys.stdin)), None


@contextlib.contextmanager
def open_output(path: str | None) -> Iterator:
    """A text stream for the translations: `path` (UTF-8, "\\n" line ends) or stdout."""
    if path is None:
        yield sys.stdout
        sys.stdout.flush()
        return
    if Path(path).is_dir():
        raise UserError(f"--output {path} is a folder; pass a file name")
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        yield handle


def translate_onnx_command(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: the command line), translate, write one translation per line. Returns 0; errors
    raise (`main` turns user errors into one line on stderr and exit status 2)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    texts = list(args.text)
    if args.model is None:
        if not texts:
            raise UserError("no export folder: pass --model FOLDER (a folder written by vt-export-onnx)")
        args.model = texts.pop(0)  # the older spelling: the folder is the first positional
    if not Path(args.model).is_dir():
        raise UserError(
            f"export folder {args.model} does not exist; pass --model FOLDER, a folder vt-export-onnx wrote"
        )
    if texts and args.input is not None:
        raise UserError("pass sentences as arguments or with --input FILE, not both")
    options = {
        "num_beams": args.num_beams,
        "max_new_tokens": args.max_new_tokens,
        "length_penalty": args.length_penalty,
    }
    show = args.progress or is_terminal(sys.stderr)
    with open_input(args.input, texts) as (lines, total), open_output(args.output) as out:
        if show and total is None and args.input is not None:
            total = count_lines(args.input)
        progress = Progress(total, enabled=show)
        translations = translate_lines(
            lines, args.model, workers=args.workers, chunk_size=args.chunk_size, batch_size=args.batch_size,
            provider=args.provider, threads=args.threads, options=options,
        )  # fmt: skip
        try:
            for translation in translations:
                out.write(translation + "\n")
                progress.update()
        finally:
            translations.close()
            progress.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """The `vt-translate-onnx` console script: `translate_onnx_command` with user errors as one line and exit 2."""
    return run_cli(translate_onnx_command, argv, prog=PROG)
