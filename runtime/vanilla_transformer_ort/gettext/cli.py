"""`vt-translate-po INPUT OUTPUT --model FOLDER`: machine pre-translation of a gettext catalog (.pot, .po or .mo in,
.po out) with every placeholder kept; what the model wrote is marked fuzzy for review (docs/localization.md).

Problems with the input give one line naming the file (and line) and what to do, and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from ..cli_common import make_parser, positive_int, run_cli
from ..contract import CONFIG_FILE, ENCODER_FILE
from ..folder import ExportFolder
from ..languages import check_target_language
from ..layouts import PYTORCH, UNKNOWN, detect_layout
from ..placeholders import STYLES
from ..protected_translation import DEFAULT_RETRY, DEFAULT_STYLE, STRATEGIES
from .catalog import (
    CatalogError,
    check_flags,
    check_output_path,
    load_catalog,
    pretranslate,
    print_progress,
    resolve_plural_forms,
    translatable_entries,
    write_catalog,
)

VERSION = "0.1.0"
PROG = "vt-translate-po"
EXAMPLE = """
vt-translate-po po/app.pot po/de.po --model runs/en-de-onnx --target_lang de
vt-translate-po po/de.po --in_place --model runs/en-de    # a PyTorch model folder, when torch is installed
"""


def build_parser() -> argparse.ArgumentParser:
    parser = make_parser(PROG, __doc__, EXAMPLE, VERSION)
    parser.add_argument("input", help="catalog to translate: .pot, .po or .mo")
    parser.add_argument("output", nargs="?", help="the .po to write (or --output; omit with --in_place)")
    parser.add_argument("--output", dest="output_flag", metavar="OUTPUT", help="the .po to write, as a flag")
    parser.add_argument("--model", required=True, help="ONNX export folder, or a PyTorch model folder (needs torch)")
    parser.add_argument("--target_lang", help="language code for the header (default: the catalog's Language)")
    parser.add_argument("--overwrite", action="store_true", help="retranslate every entry, not only untranslated ones")
    parser.add_argument(
        "--no_fuzzy",
        action="store_true",
        help="do not mark the machine translations fuzzy (with --overwrite: clear the mark of those retranslated)",
    )
    parser.add_argument("--in_place", action="store_true", help="write over INPUT (a .po)")
    parser.add_argument(
        "--plural_forms", help="Plural-Forms when the header has none, e.g. 'nplurals=2; plural=(n != 1);'"
    )
    parser.add_argument("--num_beams", type=positive_int, default=None, help="beam size (default: the model's)")
    parser.add_argument("--batch_size", type=positive_int, default=32, help="texts per model call")
    parser.add_argument("--threads", type=positive_int, default=1, help="CPU threads for the model")
    parser.add_argument("--provider", default="auto", help="onnxruntime provider: auto, cpu or cuda")
    parser.add_argument(
        "--placeholder_style",
        choices=STYLES,
        default=DEFAULT_STYLE,
        help="first attempt: none (as is), percent, brace",
    )
    parser.add_argument(
        "--retry",
        nargs="*",
        choices=STRATEGIES,
        default=list(DEFAULT_RETRY),
        help=f"what to try, in order, when a placeholder was lost (default: {' '.join(DEFAULT_RETRY)})",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


# Model folders other than ONNX exports are read by a backend that another distribution registers under this
# entry-point group: `vanilla-transformer` registers `pytorch` (its PyTorch model folders). The runtime never imports
# that package itself, so it stays torch-free and the dependency points one way only.
BACKEND_GROUP = "vanilla_transformer_ort.backends"
PYTORCH_BACKEND = "pytorch"


def registered_backend(name: str) -> Callable | None:
    """The loader registered as `name` in `BACKEND_GROUP`, or None when no installed distribution provides it."""
    from importlib.metadata import entry_points

    for entry_point in entry_points(group=BACKEND_GROUP):
        if entry_point.name == name:
            return entry_point.load()
    return None


def check_model_folder(folder: str) -> ExportFolder | Path:
    """The --model folder, checked without loading a model: an ONNX export (read as an `ExportFolder`) or a model
    folder (its path, for the registered backend)."""
    path = Path(folder)
    layout = detect_layout(path)
    if layout == PYTORCH:
        return path
    if layout != UNKNOWN or (path / ENCODER_FILE).is_file():  # an export, or what it is instead, named
        return ExportFolder(path)
    if not path.is_dir():
        raise CatalogError(f"--model {path}: no such folder; pass an ONNX export (vt-export-onnx) or a model folder")
    if (path / CONFIG_FILE).is_file():  # a model folder without weights: the backend names what is missing
        return path
    raise CatalogError(
        f"--model {path}: neither an ONNX export ({ENCODER_FILE}) nor a model folder ({CONFIG_FILE}); pass the "
        "folder vt-export-onnx or training wrote"
    )


def load_translate_batch(model: ExportFolder | Path, num_beams: int | None, threads: int, provider: str) -> Callable:
    """`translate_batch` over an ONNX export (onnxruntime) or a model folder (a registered backend)."""
    if isinstance(model, ExportFolder):
        from ..translator import OrtTranslator

        translator = OrtTranslator(model, provider=provider, intra_op_num_threads=threads)
        return lambda batch: translator.translate(list(batch), num_beams=num_beams)
    loader = registered_backend(PYTORCH_BACKEND)
    if loader is None:
        raise CatalogError(
            f"--model {model}: a PyTorch model folder needs the vanilla-transformer package (with torch); install "
            f"it, or export the folder with vt-export-onnx --model {model} --output EXPORT and pass EXPORT"
        )
    return loader(model, num_beams=num_beams, threads=threads, device="cpu" if provider == "cpu" else None)


def command(argv: list[str]) -> int:
    """Check everything cheap first (paths, catalog, flags, plural rule), then load the model and translate."""
    args = build_parser().parse_args(argv)
    model = check_model_folder(args.model)
    input_path = Path(args.input)
    if args.output is not None and args.output_flag is not None and args.output != args.output_flag:
        raise CatalogError(f"{input_path}: two outputs given ({args.output}, {args.output_flag}); pass one")
    args.output = args.output or args.output_flag
    if args.output is None and not args.in_place:
        raise CatalogError(f"{input_path}: no OUTPUT given; pass the .po to write, or --in_place to overwrite INPUT")
    output_path = input_path if args.output is None else Path(args.output)
    if not input_path.is_file():
        raise CatalogError(f"{input_path}: no such file; pass an existing .po, .pot or .mo catalog")
    check_output_path(input_path, output_path, args.in_place)
    catalog = load_catalog(input_path)
    entries = translatable_entries(catalog)
    if not entries:
        raise CatalogError(f"{input_path}: the catalog has no messages; extract them first (xgettext, msgmerge)")
    language = args.target_lang or catalog.metadata.get("Language", "").strip()
    if not language:
        raise CatalogError(f"{input_path}: the catalog names no Language; pass --target_lang (e.g. de)")
    check_target_language(model, language, "--target_lang" if args.target_lang else "the catalog's Language")
    check_flags(catalog, input_path)
    resolve_plural_forms(catalog, input_path, language, args.plural_forms, any(e.msgid_plural for e in entries))

    translate_batch = load_translate_batch(model, args.num_beams, args.threads, args.provider)
    show = not args.quiet and sys.stderr.isatty()
    report = pretranslate(
        catalog,
        input_path,
        translate_batch,
        language,
        overwrite=args.overwrite,
        mark_fuzzy=not args.no_fuzzy,
        plural_forms=args.plural_forms,
        batch_size=args.batch_size,
        retry=args.retry,
        style=args.placeholder_style,
        progress=print_progress if show else None,
    )
    write_catalog(catalog, output_path)
    for line, msgid, reason in report.failed:
        short = msgid if len(msgid) <= 60 else msgid[:57] + "..."
        print(f"{input_path}:{line}: left untranslated, {reason}: {short!r}", file=sys.stderr)
    print(
        f"{output_path}: {report.translated + report.copied} of {report.candidates} entries written "
        f"({report.retried} after a retry, {report.copied} copied as placeholders only, {report.plurals} plural), "
        f"{len(report.failed)} left untranslated; {report.entries} messages in all"
        + ("" if args.no_fuzzy else "; new translations are marked fuzzy"),
        file=sys.stderr,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point: exit status 0, or 2 with one line on stderr for a problem the user must fix."""
    return run_cli(command, argv, prog=PROG)


if __name__ == "__main__":
    sys.exit(main())
