"""Command-line entry points of the export: `export_onnx_main` (ONNX folder, then optional validation) and
`export_ctranslate2_main` (CTranslate2 folder), the `vt-export-onnx` and `vt-export-ctranslate2` console scripts;
`export/export_onnx.py` and `export/export_ctranslate2.py` call them. Same style as every `vt-*` command
(`vanilla_transformer_ort.cli_common`): `--snake_case` flags with `--kebab-case` aliases, `--version`, `--debug`, and
user errors as one line on stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vanilla_transformer_ort.cli_common import UserError, debug_requested, make_parser, run_cli

from .. import __version__
from ..progress import without_weight_progress_bars

EXPORT_ONNX_DOC = """Export a trained model folder to ONNX. --layout vanilla (the default): this package's runtime
layout (encoder, one-step decoder and helper graphs; docs/onnx.md). --layout optimum: the standard layout that
Optimum's ORTModelForSeq2SeqLM and transformers.js read (onnx/encoder_model.onnx, onnx/decoder_model_merged.onnx and a
MarianMT-shaped config; docs/onnx-standard-layout.md)."""
EXPORT_ONNX_EXAMPLE = """vt-export-onnx --model runs/base --output onnx/base --validate
vt-export-onnx --model runs/base --output onnx/base-int8 --quantize int8 --validate
vt-export-onnx --model runs/base --output onnx/base-fp16 --dtype fp16
vt-export-onnx --model runs/base --output hub/base --layout optimum --quantize int8"""
# Options that only the vanilla layout takes (the standard layout is fp32, with optional int8 files beside it).
VANILLA_ONLY_OPTIONS = ("dtype", "decoder_cache", "int8_activations", "validate", "tolerance")

EXPORT_CTRANSLATE2_DOC = """Export a trained model folder to a CTranslate2 model folder, with CTranslate2's own
converter API. Options and the length limit are in docs/ctranslate2.md."""
EXPORT_CTRANSLATE2_EXAMPLE = """vt-export-ctranslate2 --model runs/base --output ct2/base
vt-export-ctranslate2 --model runs/base --output ct2/base-int8 --quantization int8"""


def export_parser(prog: str, doc: str, example: str, output_help: str) -> argparse.ArgumentParser:
    """The options every exporter takes: the model folder, the folder to write, and an optional tokenizer folder."""
    parser = make_parser(prog, doc, example, __version__)
    parser.add_argument("--model", required=True, help="save_pretrained folder (config, weights, tokenizer)")
    parser.add_argument("--output", required=True, help=output_help)
    parser.add_argument("--tokenizer", default=None, help="folder with tokenizer.json (default: --model)")
    return parser


@contextlib.contextmanager
def quiet_exporter(quiet: bool = True) -> Iterator[None]:
    """Keep torch's ONNX exporter quiet: its progress lines on stdout, its warnings and its log records (notes
    about torchvision, axis names, pre-processing and deprecations that a user cannot act on). `--debug` shows them
    all."""
    if not quiet:
        yield
        return
    # the root logger too: onnxruntime's quantizer logs its advice there
    names = ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript", None)
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)


def export_onnx_command(argv: list[str] | None = None) -> dict[str, Any] | Path:
    """`export_model`, then `validate_folder` with `--validate`; prints the files written and returns the manifest
    (with `--layout optimum`: `export_standard_layout`, returns the folder). A non-empty `--output` is refused in
    both layouts unless `--overwrite`. Errors raise (`export_onnx_main` turns user errors into one line and exit
    status 2)."""
    from .onnx.export import export_model
    from .onnx.graphs import DEFAULT_OPSET
    from .onnx.validation import FP32_TOLERANCE, validate_folder
    from .output_folder import check_output_dir

    parser = export_parser("vt-export-onnx", EXPORT_ONNX_DOC, EXPORT_ONNX_EXAMPLE, "export folder to write")
    parser.add_argument(
        "--layout",
        choices=["vanilla", "optimum"],
        default="vanilla",
        help="vanilla: this package's runtime layout; optimum: the standard layout of Optimum and transformers.js",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace --output if it exists and is not empty")
    parser.add_argument("--dtype", choices=["fp32", "fp16"], default=None, help="fp16 is meant for GPU serving")
    parser.add_argument("--quantize", choices=["int8"], default=None, help="dynamic int8 quantization (CPU)")
    parser.add_argument("--opset", type=int, default=DEFAULT_OPSET)
    parser.add_argument(
        "--decoder_cache",
        choices=["inplace", "copy"],
        default=None,
        help="inplace (fp32, int8): also write decoder_model_inplace.onnx, whose cache is written in place (the "
        "runtime's default on CPU); copy: only the decoder that copies its cache every step",
    )
    parser.add_argument(
        "--int8_activations",
        choices=["row", "tensor"],
        default=None,
        help="with --quantize int8: one activation scale per row (default; a sentence's output does not depend on "
        "its batch) or per tensor",
    )
    parser.add_argument("--validate", action="store_true", help="compare onnxruntime with PyTorch on a shape grid")
    parser.add_argument("--tolerance", type=float, default=None, help="max abs difference allowed (fp32)")
    args = parser.parse_args(argv)
    if args.layout == "optimum":
        return _export_standard_layout(args)
    check_output_dir(Path(args.output), args.overwrite)

    try:
        with quiet_exporter(not debug_requested()):
            manifest = export_model(
                args.model,
                args.output,
                dtype=args.dtype or "fp32",
                quantize=args.quantize,
                opset=args.opset,
                tokenizer_dir=args.tokenizer,
                decoder_cache=args.decoder_cache or "inplace",
                int8_activations=args.int8_activations or "row",
            )
        if args.validate:
            manifest = validate_folder(args.model, args.output, tolerance=args.tolerance or FP32_TOLERANCE)
    except OSError as error:  # read-only or full disk, missing permissions: name the file and the cause
        where = error.filename or args.output
        raise UserError(f"cannot write or read {where}: {error.strerror or error} (--output {args.output})") from error
    quantization = manifest["quantization"] or "not quantized"
    print(f"Exported to {args.output} (opset {manifest['opset']}, {manifest['dtype']}, {quantization})")
    width = max(len(name) for name in manifest["files"])
    for name, size in manifest["files"].items():
        print(f"  {name:{width}s} {size / 2**20:9.2f} MiB")
    for variant, diffs in manifest.get("validation", {}).items():
        rounded = {kind: float(f"{value:.3g}") for kind, value in diffs.items()}
        print(f"  max |onnxruntime - PyTorch| {variant}: {json.dumps(rounded)}")
    return manifest


def _export_standard_layout(args: argparse.Namespace) -> Path:
    """`vt-export-onnx --layout optimum`: `export_standard_layout`; prints the files written and returns the folder."""
    from .onnx.standard_layout import export_standard_layout

    given = [f"--{name}" for name in VANILLA_ONLY_OPTIONS if getattr(args, name) not in (None, False)]
    if given:
        raise UserError(f"{', '.join(given)} applies to --layout vanilla only, not to --layout optimum")
    try:
        with quiet_exporter(not debug_requested()):
            output = export_standard_layout(
                args.model,
                args.output,
                quantize=args.quantize,
                tokenizer_dir=args.tokenizer,
                overwrite=args.overwrite,
                opset=args.opset,
            )
    except OSError as error:
        where = error.filename or args.output
        raise UserError(f"cannot write or read {where}: {error.strerror or error} (--output {args.output})") from error
    print(f"Exported to {output} (standard layout of Optimum and transformers.js, opset {args.opset})")
    for path in sorted(p for p in output.rglob("*") if p.is_file()):
        print(f"  {str(path.relative_to(output)):42s} {path.stat().st_size / 2**20:9.2f} MiB")
    return output


def export_ctranslate2_command(argv: list[str] | None = None):
    """`export_ctranslate2` with the command-line options; prints the files written and returns the output folder.
    Errors raise (`export_ctranslate2_main` turns user errors into one line and exit status 2)."""
    from . import CTRANSLATE2_QUANTIZATIONS

    parser = export_parser(
        "vt-export-ctranslate2",
        EXPORT_CTRANSLATE2_DOC,
        EXPORT_CTRANSLATE2_EXAMPLE,
        "CTranslate2 model folder to write",
    )
    parser.add_argument(
        "--quantization", choices=CTRANSLATE2_QUANTIZATIONS, default=None, help="weight type (default float32)"
    )
    parser.add_argument(
        "--max_positions",
        type=int,
        default=None,
        help="rows of the position table: the longest source and max_decoding_length CTranslate2 accepts "
        "(default max(1024, config.max_position_embeddings))",
    )
    parser.add_argument("--force", action="store_true", help="overwrite --output if it exists")
    args = parser.parse_args(argv)
    try:
        from .ctranslate2_export import export_ctranslate2
    except ImportError as error:
        if (error.name or "").split(".")[0] != "ctranslate2":
            raise
        raise UserError(
            "ctranslate2 is missing: install the ctranslate2 extra; from a checkout, pip install -e '.[ctranslate2]'"
        ) from None

    try:
        output = export_ctranslate2(
            args.model,
            args.output,
            quantization=args.quantization,
            max_positions=args.max_positions,
            tokenizer_dir=args.tokenizer,
            force=args.force,
        )
    except RuntimeError as error:  # CTranslate2 reports an existing --output (without --force) this way
        raise UserError(str(error)) from error
    print(f"Exported to {output} ({args.quantization or 'float32'} weights)")
    for path in sorted(output.iterdir()):
        print(f"  {path.name:28s} {path.stat().st_size / 2**20:9.2f} MiB")
    return output


def export_onnx_main(argv: list[str] | None = None) -> int:
    """The `vt-export-onnx` console script: `export_onnx_command`; returns the exit status."""
    return run_cli(without_weight_progress_bars(export_onnx_command), argv, prog="vt-export-onnx")


def export_ctranslate2_main(argv: list[str] | None = None) -> int:
    """The `vt-export-ctranslate2` console script: `export_ctranslate2_command`; returns the exit status."""
    return run_cli(without_weight_progress_bars(export_ctranslate2_command), argv, prog="vt-export-ctranslate2")
