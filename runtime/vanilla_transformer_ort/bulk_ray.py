"""`vt-translate-ray`: bulk translation of a large file with Ray Data, on every node of a cluster.

Ray Data's `map_batches` with `TranslateBatch` runs one `OrtTranslator` per actor; output line N is the translation
of input line N and a blank line stays blank, as with `vt-translate-onnx` (`bulk.py`) on one machine. Needs the
`ray` extra: `pip install "./runtime[cpu,ray]"` from a checkout.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import __version__
from .batches import translate_by_length
from .cli_common import make_parser, positive_int, run_cli
from .folder import ExportFolder

PROG = "vt-translate-ray"
EXAMPLE = """\
vt-translate-ray --model outputs/main_job/onnx --input messages.en --output messages.de --concurrency 2
"""


class TranslateBatch:
    """A Ray Data `map_batches` callable: each actor loads one `OrtTranslator` and translates a column of texts.

    Args:
        folder: the export folder.
        column: the input column (Ray Data's `read_text` names it "text"); translations go to "translation".
        threads: intra-op threads of the actor's session.
        options: generation overrides (`num_beams`, `max_new_tokens`, ...).
    """

    def __init__(self, folder: str, column: str = "text", threads: int = 1, **options):
        from .translator import OrtTranslator

        self.translator = OrtTranslator(folder, provider="cpu", intra_op_num_threads=threads)
        self.column = column
        self.options = options

    def _translate(self, texts: list[str]) -> list[str]:
        translations = self.translator.translate([text.strip() for text in texts], **self.options)
        return [text.strip() for text in translations]

    def __call__(self, batch: dict) -> dict:
        texts = [str(text) for text in batch[self.column]]
        return {**batch, "translation": translate_by_length(self._translate, texts)}


def translate_file_with_ray(
    folder: str | os.PathLike | ExportFolder,
    input_path: str | os.PathLike,
    output_path: str | os.PathLike,
    *,
    concurrency: int = 2,
    batch_size: int = 64,
    threads: int = 1,
    address: str | None = None,
    **options,
) -> int:
    """Translate `input_path` line by line into `output_path` (same line count, same order) with Ray Data:
    `concurrency` actors, each with its own session. Returns the number of lines."""
    import ray

    folder = ExportFolder.of(folder).path.resolve()  # checked here; the actors get an absolute path
    input_path = Path(input_path).resolve()
    if not input_path.is_file():
        raise ValueError(f"{input_path}: no such file")
    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True  # lines come back in input order
    context.enable_progress_bars = True
    dataset = ray.data.read_text(str(input_path), drop_empty_lines=False)
    translated = dataset.map_batches(
        TranslateBatch,
        fn_constructor_kwargs={"folder": str(folder), "threads": threads, **options},
        batch_size=batch_size,
        concurrency=concurrency,
        num_cpus=threads,
    )
    lines = 0
    with open(output_path, "w", encoding="utf-8") as output:
        for batch in translated.iter_batches(batch_size=batch_size, batch_format="numpy"):
            for text in batch["translation"]:
                output.write(f"{text}\n")
                lines += 1
    return lines


def translate_ray_command(argv: list[str]) -> None:
    """Parse `argv` and translate a file with Ray Data."""
    parser = make_parser(
        PROG,
        "Translate a large text file, one sentence a line, with Ray Data actors (a local Ray instance, or a "
        "cluster with --ray_address auto). Output line N is the translation of input line N; blank lines stay blank.",
        EXAMPLE,
        __version__,
    )
    parser.add_argument("--model", required=True, metavar="FOLDER", help="ONNX export folder")
    parser.add_argument("--input", required=True, help="text file, one sentence a line")
    parser.add_argument("--output", required=True, help="where the translations go")
    parser.add_argument("--concurrency", type=positive_int, default=2, help="Ray Data actors (default 2)")
    parser.add_argument("--threads", type=positive_int, default=1, help="threads an actor (default 1)")
    parser.add_argument("--batch_size", type=positive_int, default=64, help="lines a batch (default 64)")
    parser.add_argument("--num_beams", type=positive_int, default=None, help="beam size (default: the folder's)")
    parser.add_argument("--ray_address", default=None, help="a running cluster ('auto'); default: start one here")
    args = parser.parse_args(argv)
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ValueError(
            "ray is missing: install the ray extra; from a checkout, pip install './runtime[cpu,ray]'"
        ) from None
    options = {"num_beams": args.num_beams} if args.num_beams else {}
    lines = translate_file_with_ray(
        args.model,
        args.input,
        args.output,
        concurrency=args.concurrency,
        batch_size=args.batch_size,
        threads=args.threads,
        address=args.ray_address,
        **options,
    )
    print(f"Translated {lines} lines into {args.output}")


def translate_ray_main(argv: list[str] | None = None) -> int:
    """The `vt-translate-ray` console script."""
    return run_cli(translate_ray_command, argv, prog=PROG)
