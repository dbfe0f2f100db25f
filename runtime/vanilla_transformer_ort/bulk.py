"""Translate files of any length with bounded memory: lines are read in chunks, each chunk is sorted by length into
batches (less padding), translated by one or several onnxruntime processes, and written back in input order.

A blank input line (empty or only spaces) gives an empty output line without reaching the model, so line N of the
output is always the translation of line N of the input (`batches.py`). The `vt-translate-onnx` command (`cli.py`)
runs on this; `bulk_ray.py` does the same on a Ray cluster.
"""

from __future__ import annotations

import collections
import io
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from typing import IO, Any

from .batches import translate_by_length
from .folder import ExportFolder
from .translator import OrtTranslator
from .worker_pool import start_translator_pool, worker_translator

DEFAULT_CHUNK_SIZE = 1000  # lines read, sorted and translated together; a chunk goes to one worker


def read_lines(stream: IO, name: str = "<stdin>") -> Iterator[str]:
    """The lines of `stream` without their line ends, one at a time; a byte stream must hold UTF-8.

    Args:
        stream: a binary stream (a file opened with "rb", `sys.stdin.buffer`) or a text stream.
        name: the stream's name for error messages.
    Raises:
        ValueError: a line is not UTF-8 (the message names `name:line`).
    """
    for number, line in enumerate(stream, start=1):
        if isinstance(line, bytes):
            try:
                line = line.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"{name}:{number} is not UTF-8 ({error.reason} at byte {error.start}); convert the file, e.g. "
                    f"iconv -f latin1 -t utf-8"
                ) from None
        yield line.rstrip("\r\n")


def count_lines(path: str | os.PathLike) -> int:
    """Lines in a file (a last line without a line end counts), read in 1 MiB blocks."""
    count, last = 0, b"\n"
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def chunked(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    """Lists of `size` consecutive lines (the last one shorter), pulled from `lines` only as they are needed."""
    if size < 1:
        raise ValueError(f"chunk size must be >= 1, got {size}")
    chunk = []
    for line in lines:
        chunk.append(line)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def translate_chunk(
    translator: OrtTranslator, lines: list[str], batch_size: int, options: dict[str, Any] | None = None
) -> list[str]:
    """Translations of `lines`, in their order: blank lines give "", the others go through the model in length-sorted
    batches. A line break inside a translation becomes a space, so the output keeps one line per input line."""
    translations = translate_by_length(lambda batch: translator.translate(batch, **(options or {})), lines, batch_size)
    return [text.replace("\r", " ").replace("\n", " ") for text in translations]


# -- worker processes -------------------------------------------------------------------------------------------


def _translate_in_worker(lines: list[str], batch_size: int, options: dict[str, Any]) -> list[str]:
    return translate_chunk(worker_translator(), lines, batch_size, options)


class _Done:
    """A finished result with a future's `result()`: the one-worker path runs in this process."""

    def __init__(self, value: list[str]):
        self.value = value

    def result(self) -> list[str]:
        return self.value


def in_order(
    chunks: Iterable[list[str]], submit: Callable[[list[str]], Future | _Done], max_in_flight: int
) -> Iterator[str]:
    """Submit chunks as they come and yield their results' lines in submission order, with at most `max_in_flight`
    chunks submitted but not yet yielded: the reader runs at most that many chunks ahead of the writer."""
    pending: collections.deque = collections.deque()
    for chunk in chunks:
        pending.append(submit(chunk))
        if len(pending) >= max_in_flight:
            yield from pending.popleft().result()
    while pending:
        yield from pending.popleft().result()


def translate_lines(
    lines: Iterable[str],
    folder: str | os.PathLike | ExportFolder,
    *,
    workers: int = 1,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    batch_size: int = 32,
    provider: str = "auto",
    threads: int = 1,
    options: dict[str, Any] | None = None,
    translator: OrtTranslator | None = None,
) -> Iterator[str]:
    """Translate `lines` lazily: one translation per line, in input order, with bounded memory.

    At most `chunk_size * (workers + 1)` lines are read and not yet yielded at any time, so a file of a million
    lines streams through. The same `chunk_size` and `batch_size` give the same output for any `workers`.

    Args:
        lines: source sentences, one per item, without line ends (e.g. `read_lines(file)`); blank ones give "".
        folder: the export folder (a path, or an `ExportFolder` already read).
        workers: onnxruntime processes; 1 translates in this process.
        chunk_size: lines sorted and batched together (one worker's task).
        batch_size: sentences per model call.
        provider: "auto", "cpu" or "cuda".
        threads: intra-op threads of each process's sessions.
        options: generation overrides (`num_beams`, `max_new_tokens`, `length_penalty`, ...).
        translator: an `OrtTranslator` of `folder` to use when `workers` is 1 (default: load one).
    Yields:
        str: the translation of each line of `lines`.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    options = {key: value for key, value in (options or {}).items() if value is not None}
    chunks = chunked(lines, chunk_size)
    if workers == 1:
        if translator is None:
            translator = OrtTranslator(folder, provider=provider, intra_op_num_threads=threads)
        yield from in_order(chunks, lambda chunk: _Done(translate_chunk(translator, chunk, batch_size, options)), 1)
        return
    # the folder is checked here, so that the workers fail on nothing this process could have reported
    pool = start_translator_pool(ExportFolder.of(folder), workers, provider, threads)
    try:
        submit = lambda chunk: pool.submit(_translate_in_worker, chunk, batch_size, options)  # noqa: E731
        yield from in_order(chunks, submit, workers + 1)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


# -- progress ---------------------------------------------------------------------------------------------------


class Progress:
    """Lines done on stderr: a tqdm bar when tqdm is installed, else a counter redrawn twice a second.

    Args:
        total: lines expected, when known (a file given by name), else None.
        enabled: False draws nothing (the default where stderr is not a terminal).
        stream: where to draw (stderr; never stdout, which holds the translations).
    """

    def __init__(self, total: int | None, enabled: bool, stream: IO[str] | None = None):
        self.total, self.enabled, self.stream = total, enabled, stream or sys.stderr
        self.done, self.started, self.drawn = 0, time.monotonic(), 0.0
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                pass
            else:
                self.bar = tqdm(total=total, unit="line", file=self.stream, dynamic_ncols=True, mininterval=0.5)

    def update(self, count: int = 1) -> None:
        """Count `count` more lines done."""
        self.done += count
        if self.bar is not None:
            self.bar.update(count)
        elif self.enabled and time.monotonic() - self.drawn >= 0.5:
            self._draw()

    def _draw(self) -> None:
        self.drawn = time.monotonic()
        rate = self.done / max(self.drawn - self.started, 1e-9)
        of = f"/{self.total}" if self.total is not None else ""
        self.stream.write(f"\r{self.done}{of} lines, {rate:.1f} lines/s")
        self.stream.flush()

    def close(self) -> None:
        """Finish the bar (its last state stays on screen)."""
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            self._draw()
            self.stream.write("\n")
            self.stream.flush()


def is_terminal(stream: IO | None) -> bool:
    """Whether `stream` is an interactive terminal (False for pipes, files and test captures)."""
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return False
