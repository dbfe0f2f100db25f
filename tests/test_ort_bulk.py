"""`vt-translate-onnx` on large inputs (`vanilla_transformer_ort.bulk`): streaming in input order, blank lines kept,
lazy reading with bounded memory, several worker processes with the same output as one, progress on stderr only."""

from __future__ import annotations

import io
import random

import pytest

from tests.onnx_helpers import WORDS, trained_export_dir
from vanilla_transformer_ort import OrtTranslator
from vanilla_transformer_ort.batches import length_batches
from vanilla_transformer_ort.bulk import Progress, chunked, count_lines, read_lines, translate_lines
from vanilla_transformer_ort.cli import main


@pytest.fixture(scope="module")
def translator() -> OrtTranslator:
    return OrtTranslator(trained_export_dir(), provider="cpu")


def sentences(count: int, seed: int = 0) -> list[str]:
    """Copy-task sentences of 1-9 words, with a blank or whitespace-only line every few lines."""
    rng = random.Random(seed)
    lines = []
    for index in range(count):
        if index % 7 == 3:
            lines.append("" if index % 2 else "   ")
        else:
            lines.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 9))))
    return lines


def one_by_one(translator: OrtTranslator, lines: list[str]) -> list[str]:
    return [translator.translate([line])[0] if line.strip() else "" for line in lines]


def test_stream_keeps_input_order_and_blank_lines(translator):
    lines = sentences(23)
    out = list(translate_lines(lines, trained_export_dir(), chunk_size=5, batch_size=2, translator=translator))
    assert len(out) == len(lines)
    assert [text for line, text in zip(lines, out, strict=True) if not line.strip()] == [""] * 3
    assert out == one_by_one(translator, lines)  # length-sorted batches, written back in input order


def test_length_batches_sort_and_skip_blank_lines():
    lines = ["a b c", "", "a", "a b", "  ", "a b c d"]
    assert length_batches(lines, 2) == [[2, 3], [0, 5]]
    assert list(chunked(iter("abcde"), 2)) == [["a", "b"], ["c", "d"], ["e"]]


@pytest.mark.parametrize("workers", [1, 2])
def test_reads_lazily_with_bounded_memory(translator, workers):
    """The reader never runs more than chunk_size * (workers + 2) lines ahead of the writer."""
    chunk_size, total = 4, 120 if workers == 1 else 60
    source = sentences(total, seed=workers)
    read = 0

    def reader():
        nonlocal read
        for line in source:
            read += 1
            yield line

    written, ahead = 0, []
    for _ in translate_lines(
        reader(), trained_export_dir(), workers=workers, chunk_size=chunk_size, batch_size=3, provider="cpu",
        translator=translator if workers == 1 else None,
    ):  # fmt: skip
        written += 1
        ahead.append(read - written)
        if written == 1:
            assert read < total  # the first translation comes before the input is read to its end
    assert written == read == total
    assert max(ahead) <= chunk_size * (workers + 2), max(ahead)


def test_two_workers_give_the_same_output_as_one(translator):
    lines = sentences(41, seed=3)
    options = {"num_beams": 2, "max_new_tokens": 12}
    one = list(translate_lines(lines, trained_export_dir(), chunk_size=6, batch_size=4, options=options,
                               translator=translator))  # fmt: skip
    two = list(translate_lines(lines, trained_export_dir(), workers=2, chunk_size=6, batch_size=4, options=options,
                               provider="cpu"))  # fmt: skip
    assert two == one and len(one) == len(lines)


def test_cli_file_to_file_and_stdin_to_stdout(translator, tmp_path, capsys, monkeypatch):
    lines = sentences(15, seed=5)
    source = tmp_path / "in.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    target = tmp_path / "out.txt"
    common = ["--provider", "cpu", "--chunk_size", "4", "--batch_size", "3"]
    assert main(["--model", str(trained_export_dir()), "--input", str(source), "--output", str(target), *common]) == 0
    expected = one_by_one(translator, lines)
    assert target.read_text(encoding="utf-8").split("\n") == [*expected, ""]
    assert capsys.readouterr().out == ""

    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(source.read_bytes()), encoding="utf-8"))
    assert main([str(trained_export_dir()), "--workers", "2", "--chunk-size", "4", "--batch-size", "3",
                 "--provider", "cpu"]) == 0  # fmt: skip
    assert capsys.readouterr().out.split("\n") == [*expected, ""]


def test_progress_goes_to_stderr_only(translator, tmp_path, capsys, monkeypatch):
    source = tmp_path / "in.txt"
    source.write_text("a b\n\nc\n", encoding="utf-8")
    assert main(["--model", str(trained_export_dir()), "--input", str(source), "--progress", "--provider", "cpu"]) == 0
    captured = capsys.readouterr()
    assert captured.out.split("\n") == [*one_by_one(translator, ["a b", "", "c"]), ""]
    assert "3/3" in captured.err  # the total is counted from the file

    monkeypatch.setitem(__import__("sys").modules, "tqdm", None)  # without tqdm: a plain counter
    stream = io.StringIO()
    progress = Progress(total=None, enabled=True, stream=stream)
    progress.update(5)
    progress.close()
    assert "5 lines" in stream.getvalue() and stream.getvalue().endswith("\n")
    silent = io.StringIO()
    Progress(total=3, enabled=False, stream=silent).close()
    assert silent.getvalue() == ""


def test_read_lines_checks_utf8_and_strips_line_ends(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes("\ufeffa b\r\nc\n".encode() + "é\n".encode("latin-1"))
    with open(path, "rb") as handle, pytest.raises(ValueError, match=r"in\.txt:3 is not UTF-8"):
        assert list(read_lines(handle, "in.txt"))[:2] == ["a b", "c"]
    with open(path, "rb") as handle:
        lines = read_lines(handle, "in.txt")
        assert [next(lines), next(lines)] == ["a b", "c"]  # BOM and CRLF removed
    assert count_lines(path) == 3
    (tmp_path / "no-end.txt").write_bytes(b"a\nb")
    assert count_lines(tmp_path / "no-end.txt") == 2
