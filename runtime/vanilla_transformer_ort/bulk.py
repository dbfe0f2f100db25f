"""Translate files of any length with bounded memory: lines are read in chunks, each chunk is sorted by length into
batches (less padding), translated by one or several onnxruntime processes, and written back in input order.

A blank input line (empty or only spaces) gives an empty output line without reaching the model, so line N of the
output is always the translation of line N of the input. The `vt-translate-onnx` command (`cli.py`) runs on this.
"""

from __future__ import annotations

import collections
import io
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import IO, Any

from .contract import CONFIG_FILE, DECODER_FILE, ENCODER_FILE, EXPORT_AGAIN
from .translator import OrtTranslator, load_tokenizer, settings_from_folder

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


def length_batches(lines: list[str], batch_size: int) -> list[list[int]]:
    """Indices of the non-blank `lines`, sorted by length (characters, a stand-in for tokens) and cut into batches
    of at most `batch_size`: sentences of like length share a batch, so little of it is padding."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = sorted((index for index, line in enumerate(lines) if line.strip()), key=lambda index: len(lines[index]))
    return [order[start : start + batch_size] for start in range(0, len(order), batch_size)]


def translate_chunk(
    translator: OrtTranslator, lines: list[str], batch_size: int, options: dict[str, Any] | None = None
) -> list[str]:
    """Translations of `lines`, in their order: blank lines give "", the others go through the model in length-sorted
    batches. A line break inside a translation becomes a space, so the output keeps one line per input line."""
    translations = [""] * len(lines)
    for batch in length_batches(lines, batch_size):
        outputs = translator.translate([lines[index] for index in batch], **(options or {}))
        for index, text in zip(batch, outputs, strict=True):
            translations[index] = text.replace("\r", " ").replace("\n", " ")
    return translations


def check_export_folder(folder: str | os.PathLike) -> None:
    """The checks `OrtTranslator` starts with (folder, graph and config files, tokenizer, generation settings),
    without loading any graph: worker processes then fail on nothing the parent could have reported."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"export folder {folder} does not exist; pass a folder vt-export-onnx wrote")
    for name in (ENCODER_FILE, DECODER_FILE, CONFIG_FILE):
        if not (folder / name).is_file():
            raise ValueError(f"export folder {folder} has no {name}; {EXPORT_AGAIN}")
    load_tokenizer(folder)
    settings_from_folder(folder)


# -- worker processes -------------------------------------------------------------------------------------------

_worker_translator: OrtTranslator | None = None
_worker_error: Exception | None = None


def _start_worker(folder: str, provider: str, threads: int) -> None:
    """Process-pool initializer: one `OrtTranslator` per process. An error is kept and raised by the first task, so
    the parent sees the exception itself rather than a broken pool."""
    global _worker_translator, _worker_error
    try:
        _worker_translator = OrtTranslator(folder, provider=provider, intra_op_num_threads=threads)
    except Exception as error:
        _worker_error = error


def _translate_in_worker(lines: list[str], batch_size: int, options: dict[str, Any]) -> list[str]:
    if _worker_error is not None:
        raise _worker_error
    return translate_chunk(_worker_translator, lines, batch_size, options)


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
    folder: str | os.PathLike,
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
        folder: the export folder.
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
    check_export_folder(folder)
    # spawn: fresh interpreters on every platform; no copy of a parent's threads or onnxruntime state
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_start_worker,
        initargs=(str(folder), provider, threads),
    )
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
