"""Progress display of the package's long jobs: its INFO logs on stderr with the time of day (`vt-main-job`), and
transformers' weight loading and saving bars, which the commands show only with `--debug`.

Below both the command lines (`cli.py`) and the training code (`training/main_job.py`), so neither imports the other.
"""

from __future__ import annotations

import contextlib
import functools
import logging as std_logging
from collections.abc import Callable, Iterator
from typing import Any


def show_package_progress() -> None:
    """This package's INFO logs (each step of the job, corpus sizes, averaging) on stderr with the time of day;
    transformers' own logs stay at WARNING, since the Trainer's INFO messages would bury them."""
    from transformers.utils import logging

    logging.set_verbosity_warning()
    package_logger = std_logging.getLogger(__name__.split(".")[0])
    package_logger.setLevel(std_logging.INFO)
    if not package_logger.handlers:
        handler = std_logging.StreamHandler()
        handler.setFormatter(std_logging.Formatter("[%(asctime)s] %(levelname)s %(message)s", datefmt="%H:%M:%S"))
        package_logger.addHandler(handler)


@contextlib.contextmanager
def weight_progress_bars(show: bool) -> Iterator[None]:
    """Within the block, transformers' own progress bars ("Loading weights", "Writing model shards": a model folder
    read or written, seconds at most) only when `show`; the Hub's download bars stay as they were. Restored after."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging

    if show or not logging.is_progress_bar_enabled():
        yield
        return
    hub_bars_off = are_progress_bars_disabled()
    logging.disable_progress_bar()  # the Hub's bars too: turned back on below
    if not hub_bars_off:
        enable_progress_bars()
    try:
        yield
    finally:
        logging.enable_progress_bar()  # the Hub's too
        if hub_bars_off:
            disable_progress_bars()


def without_weight_progress_bars(command: Callable[[list[str]], Any]) -> Callable[[list[str]], Any]:
    """`command` (a `*_command(argv)` that `run_cli` runs) with transformers' weight bars shown only under `--debug`
    (or `VT_DEBUG=1`), which `run_cli` has read by the time it calls `command`."""
    from vanilla_transformer_ort.cli_common import debug_requested

    @functools.wraps(command)
    def run(argv: list[str]) -> Any:
        with weight_progress_bars(debug_requested()):
            return command(argv)

    return run
