"""The output folder of an export that writes a whole folder (the MarianMT folder, the standard ONNX layout): refused
when it holds files unless asked to replace them, assembled beside its final place and renamed into it at the end, so
a failed export leaves nothing half-written and an existing folder untouched until then."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def check_output_dir(output_dir: Path, overwrite: bool) -> None:
    """Refuse an output folder that exists and holds files unless `overwrite`; refuse a path that is a file."""
    if output_dir.exists() and not output_dir.is_dir():
        raise ValueError(f"--output {output_dir} is a file, not a folder")
    if output_dir.is_dir() and any(output_dir.iterdir()) and not overwrite:
        raise ValueError(f"--output {output_dir} exists and is not empty; pass --overwrite to replace it")


@contextlib.contextmanager
def staged_output(output_dir: Path) -> Iterator[Path]:
    """A folder to write (it does not exist yet) in a temporary folder beside `output_dir`; when the block ends
    without an error it replaces `output_dir`. The temporary folder is removed either way."""
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.", dir=output_dir.parent))
    try:
        stage = staging / "export"
        yield stage
        _replace(stage, output_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _replace(stage: Path, output_dir: Path) -> None:
    """Move the finished folder to `output_dir`; an existing one (checked by the caller) is replaced."""
    if output_dir.is_dir():
        old = output_dir.with_name(f".{output_dir.name}.replaced-{os.getpid()}")
        output_dir.rename(old)
        try:
            stage.rename(output_dir)
        except OSError:
            old.rename(output_dir)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        stage.rename(output_dir)
