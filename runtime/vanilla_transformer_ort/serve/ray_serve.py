"""Scale-out on Ray: the same app as N Ray Serve replicas, and bulk translation with Ray Data.

Ray Serve runs `build_app` once per replica (each loads its own sessions and batches the requests Ray's proxy routes
to it, so the app's own cross-request batching applies inside every replica; Ray's `@serve.batch` is not used on
top). `vt-serve FOLDER --ray_replicas N` starts it on a local Ray instance, or on a running cluster with
`--ray_address auto`. Ray Data's `map_batches` with `TranslateBatch` translates a large file on every node of a
cluster (`vt-translate-ray`). Needs the `ray` extra: `pip install "./runtime[cpu,serve,ray]"` from a checkout.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

from . import build_app
from .models import check_unique, parse_model_spec
from .settings import ServeSettings

logger = logging.getLogger(__name__)
DEPLOYMENT_NAME = "vt_translator"
APP_NAME = "vt_serve"


def deployment(models: Sequence[str], settings: ServeSettings, replicas: int, cpus_per_replica: float = 1.0):
    """A bound Ray Serve application: `replicas` copies of the app serving `models` (FOLDER or SRC-TGT=FOLDER)."""
    from ray import serve

    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    # Check the folders here, where the command runs, so a typo fails at once and not inside every replica; the
    # replicas get absolute paths (their working directory is Ray's).
    specs = [parse_model_spec(model) for model in models]
    check_unique(specs)
    resolved = [f"{spec.pair}={spec.folder.resolve()}" for spec in specs]
    # A replica is a Ray actor process already: its sessions run in its threads, and Ray places the replicas. A
    # translated file waits on the replica that made it, where Ray's proxy may not route its download: with more
    # than one replica, /translate_file is off (403, and the web page hides its file tab).
    settings = dataclasses.replace(
        settings, session_workers="thread", files_translation=settings.files_translation and replicas == 1
    )

    def builder():  # a plain function: Ray Serve calls it on each replica to build the ASGI app there
        return build_app(resolved, settings)

    ingress = serve.ingress(builder)()
    return serve.deployment(
        ingress,
        name=DEPLOYMENT_NAME,
        num_replicas=replicas,
        ray_actor_options={"num_cpus": cpus_per_replica},
        max_ongoing_requests=max(settings.max_queue, 1),
    ).bind()


def run_ray_serve(
    models: Sequence[str],
    settings: ServeSettings,
    *,
    replicas: int,
    host: str = "127.0.0.1",
    port: int = 8000,
    address: str | None = None,
    cpus_per_replica: float = 1.0,
    block: bool = True,
):
    """Start Ray (or join `address`), deploy the app with `replicas` replicas on `host:port`, and, with `block`,
    serve until interrupted. Returns the app's handle when not blocking."""
    import ray
    from ray import serve

    if not ray.is_initialized():
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": host, "port": port})
    app = deployment(models, settings, replicas, cpus_per_replica)
    handle = serve.run(app, name=APP_NAME, route_prefix="/")
    logger.info("Ray Serve: %d replica(s) on http://%s:%d", replicas, host, port)
    if not block:
        return handle
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()
    return None


class TranslateBatch:
    """A Ray Data `map_batches` callable: each actor loads one `OrtTranslator` and translates a column of texts.

    Args:
        folder: the export folder.
        column: the input column (Ray Data's `read_text` names it "text"); translations go to "translation".
        threads: intra-op threads of the actor's session.
        options: generation overrides (`num_beams`, `max_new_tokens`, ...).
    """

    def __init__(self, folder: str, column: str = "text", threads: int = 1, **options):
        from ..translator import OrtTranslator

        self.translator = OrtTranslator(folder, provider="cpu", intra_op_num_threads=threads)
        self.column = column
        self.options = options

    def __call__(self, batch: dict) -> dict:
        texts = [str(text) for text in batch[self.column]]
        todo = [i for i, text in enumerate(texts) if text.strip()]
        out = [""] * len(texts)
        if todo:
            translated = self.translator.translate([texts[i].strip() for i in todo], **self.options)
            for i, text in zip(todo, translated, strict=True):
                out[i] = text.strip()
        return {**batch, "translation": out}


def translate_file_with_ray(
    folder: str | os.PathLike,
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

    from .models import check_export_folder

    folder = Path(folder).resolve()
    check_export_folder(folder)
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


RAY_EXAMPLE = """\
vt-translate-ray --model outputs/main_job/onnx --input messages.en --output messages.de --concurrency 2
"""


def translate_ray_command(argv: list[str]) -> None:
    """Parse `argv` and translate a file with Ray Data."""
    from .. import __version__
    from ..cli_common import make_parser, positive_int

    parser = make_parser(
        "vt-translate-ray",
        "Translate a large text file, one sentence a line, with Ray Data actors (a local Ray instance, or a "
        "cluster with --ray_address auto). Output line N is the translation of input line N; blank lines stay blank.",
        RAY_EXAMPLE,
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
    from ..cli_common import run_cli

    return run_cli(translate_ray_command, argv, prog="vt-translate-ray")
