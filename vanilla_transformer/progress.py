"""Progress display of the package's long jobs: its INFO logs on stderr with the time of day (`vt-main-job`).

Below both the command lines (`cli.py`) and the training code (`training/main_job.py`), so neither imports the other.
"""

from __future__ import annotations

import logging as std_logging


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
