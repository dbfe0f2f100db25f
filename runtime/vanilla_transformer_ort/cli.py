"""`vt-translate-onnx FOLDER [TEXT ...]` (or `python -m vanilla_transformer_ort`): translate text with an export
folder, one sentence per line on stdin if no TEXT is given."""

from __future__ import annotations

import argparse
import sys

from .translator import OrtTranslator


def main(argv: list[str] | None = None) -> None:
    """Parse `argv` (default: the command line), translate, print one translation per line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("folder", help="export folder written by export/export_onnx.py")
    parser.add_argument("text", nargs="*", help="sentences to translate (default: one per line on stdin)")
    parser.add_argument("--provider", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads")
    parser.add_argument("--num-beams", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--length-penalty", type=float, default=None)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        parser.error(f"--batch-size must be >= 1, got {args.batch_size}")

    translator = OrtTranslator(args.folder, provider=args.provider, intra_op_num_threads=args.threads)
    texts = args.text or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    options = {
        "num_beams": args.num_beams,
        "max_new_tokens": args.max_new_tokens,
        "length_penalty": args.length_penalty,
    }
    for start in range(0, len(texts), args.batch_size):
        for line in translator.translate(texts[start : start + args.batch_size], **options):
            print(line)
