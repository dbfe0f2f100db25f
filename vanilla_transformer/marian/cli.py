"""The two MarianMT commands: `vt-convert-marian` (import, `importer.save_converted`) and `vt-export-marian` (export,
`exporter.save_marian`). Each `*_command(argv)` returns what it made (for Python callers and tests; errors raise) and
each `*_main` is its console script (`vanilla_transformer_ort.cli_common.run_cli`: a user error is one line on stderr
and exit status 2).
"""

from __future__ import annotations

from pathlib import Path

from vanilla_transformer_ort.cli_common import UserError, add_flag_alias, run_cli

from ..cli_parsers import CONFIG_FILE, _parser, check_model_folder
from ..export.cli import export_parser
from ..progress import without_weight_progress_bars

EXPORT_MARIAN_DOC = """Export a trained model folder as a native MarianMT folder, exactly (the inverse of
vt-convert-marian). The folder loads with transformers' MarianMTModel / AutoModelForSeq2SeqLM and AutoTokenizer
without this package or remote model code. Inputs and outputs must stay shorter than --max_positions tokens (Marian's
positional table is fixed). For CTranslate2 use vt-export-ctranslate2: ct2-transformers-converter assumes OPUS-MT's
vocabulary and decoder start (docs/marian.md)."""
EXPORT_MARIAN_EXAMPLE = """vt-export-marian --model out/model --output out/model-marian
vt-export-marian --model out/model --output out/model-marian --max_positions 512 --overwrite"""


def convert_marian_command(argv: list[str] | None = None):
    """Convert a MarianMT / OPUS-MT checkpoint (a folder or a Hub id) into a vanilla-transformer model folder, exactly.

    The folder holds the model (with its remote code), Marian's generation config and tokenizer files; it loads with
    `AutoModelForSeq2SeqLM.from_pretrained`, fine-tunes with vt-train and exports with vt-export-onnx. The logic
    lives in `vanilla_transformer.marian.importer`.

    Example:
        vt-convert-marian --model Helsinki-NLP/opus-mt-en-de --output out/opus-mt-en-de
    """
    parser = _parser(convert_marian_command, "vt-convert-marian")
    parser.add_argument(
        "--model", required=True, help="MarianMTModel folder or Hub id (e.g. Helsinki-NLP/opus-mt-en-de)"
    )
    parser.add_argument("--output", required=True, help="folder to write")
    parser.add_argument("--no_verify", action="store_true", help="skip the logits comparison with MarianMTModel")
    args = parser.parse_args(argv)
    if Path(args.model).is_dir() and not (Path(args.model) / CONFIG_FILE).is_file():
        raise UserError(f"--model {args.model} is not a MarianMT folder (no {CONFIG_FILE}); pass a folder or Hub id")

    from .importer import save_converted

    report = save_converted(args.model, args.output, verify=not args.no_verify)
    print(report)
    print(f"Saved to {args.output}")
    return report


def export_marian_command(argv: list[str] | None = None) -> Path:
    """`exporter.save_marian`, then `verify_export` on the written folder; prints the largest logit difference
    and returns the folder. Errors raise (`export_marian_main` turns user errors into one line and exit status 2)."""
    parser = export_parser("vt-export-marian", EXPORT_MARIAN_DOC, EXPORT_MARIAN_EXAMPLE, "MarianMT folder to write")
    add_flag_alias(parser, "--output", "--output_dir")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty --output folder")
    parser.add_argument(
        "--max_positions", type=int, help="rows of Marian's position table (default: max(1024, the model's length))"
    )
    args = parser.parse_args(argv)
    check_model_folder(args.model, must_exist=True)

    from .exporter import save_marian, verify_export

    output = save_marian(args.model, args.output, args.tokenizer, args.overwrite, args.max_positions)
    difference = verify_export(args.model, output)
    print(f"max |logits(MarianMTModel) - logits(this model)| on a random batch: {difference:.2e}")
    print(f"Saved a MarianMTModel folder to {output}")
    return output


def convert_marian_main(argv: list[str] | None = None) -> int:
    """The `vt-convert-marian` console script: `convert_marian_command`; returns the exit status."""
    return run_cli(without_weight_progress_bars(convert_marian_command), argv, prog="vt-convert-marian")


def export_marian_main(argv: list[str] | None = None) -> int:
    """The `vt-export-marian` console script: `export_marian_command`; returns the exit status."""
    return run_cli(without_weight_progress_bars(export_marian_command), argv, prog="vt-export-marian")
