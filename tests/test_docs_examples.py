"""Every code block in README.md, the documentation (docs/**/*.md) and benchmarks/README.md runs, or says by name why
it does not.

- ```python blocks run, one page at a time in one process and in page order (a later block may use what an earlier
  one saved), in a folder holding tiny stand-ins for the folders the docs name.
- ```bash blocks: every `vt-*` command, `scripts/*.py`, `export/*.py` and `python -m benchmarks.*` they name must
  exist, and every `--flag` given to one must appear in its `--help` (snake_case and kebab-case spellings are the
  same flag). Blocks marked `run` are executed as well.

A block is steered by an HTML comment on the line just before its fence:

    <!-- docs-test: skip REASON -->       not run (the reason is reported as the skip reason of its test)
    <!-- docs-test: setup=tiny_model -->  run after `my-transformer/` and `runs/demo/` are made (a tiny model)
    <!-- docs-test: setup=tiny_onnx -->   also `runs/demo-onnx/` (its ONNX export)
    <!-- docs-test: run -->               run a bash block too (combine: `setup=tiny_onnx run`)
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARKER = re.compile(r"<!--\s*docs-test:\s*(.*?)\s*-->")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
# README.md's Python blocks are run by tests/test_readme.py, which also checks its two commands.
RUN_ELSEWHERE = {"README.md": "run by tests/test_readme.py"}
SCRIPT_COMMANDS = {"scripts": "vt-{}", "export": "vt-{}"}
ENV = {
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
}


@dataclass
class Block:
    page: str  # path relative to the repository
    line: int
    lang: str
    code: str
    marker: str

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def skip_reason(self) -> str | None:
        if self.marker.startswith("skip"):
            return self.marker[4:].strip() or "no reason given"
        return None

    @property
    def setup(self) -> str | None:
        found = re.search(r"setup=(\w+)", self.marker)
        return found.group(1) if found else None


def read_blocks(path: Path) -> list[Block]:
    page = str(path.relative_to(ROOT))
    blocks, lines = [], path.read_text().splitlines()
    index, marker = 0, ""
    while index < len(lines):
        line = lines[index]
        if MARKER.search(line):
            marker = MARKER.search(line).group(1)
        elif FENCE.match(line):
            indent, lang = FENCE.match(line).groups()
            end = index + 1
            while not re.match(rf"^{indent}```\s*$", lines[end]):
                end += 1
            code = "\n".join(text[len(indent) :] for text in lines[index + 1 : end])
            blocks.append(Block(page, index + 1, lang, code + "\n", marker))
            index, marker = end, ""
        elif line.strip():
            marker = ""
        index += 1
    return blocks


BLOCKS = [block for page in PAGES for block in read_blocks(page)]
PYTHON = [block for block in BLOCKS if block.lang == "python"]
BASH = [block for block in BLOCKS if block.lang == "bash"]


# ---------------------------------------------------------------------------------------------- python blocks


def make_tiny_folders(target: Path, with_onnx: bool) -> None:
    """my-transformer/ and runs/demo/ (a tiny model with a tokenizer), and runs/demo-onnx/ (its export)."""
    from tests.onnx_helpers import CONFIG, build_tokenizer
    from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

    model = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig(**CONFIG)).eval()
    for folder in (target / "my-transformer", target / "runs" / "demo"):
        model.save_pretrained(folder)
        build_tokenizer().save_pretrained(folder)
    if with_onnx:
        from vanilla_transformer.export.onnx.export import export_model

        export_model(target / "runs" / "demo", target / "runs" / "demo-onnx")


@pytest.fixture(scope="session")
def tiny_folders(tmp_path_factory):
    @functools.cache
    def build(with_onnx: bool) -> Path:
        folder = tmp_path_factory.mktemp("onnx" if with_onnx else "model")
        make_tiny_folders(folder, with_onnx)
        return folder

    return build


def prepare(folder: Path, blocks: list[Block], tiny_folders) -> None:
    setups = {block.setup for block in blocks}
    if setups & {"tiny_model", "tiny_onnx"}:
        shutil.copytree(tiny_folders("tiny_onnx" in setups), folder, dirs_exist_ok=True)


# One process runs every page (torch and transformers are imported once), each page in its own folder with fresh
# globals per block; the report says which block of which page failed.
RUNNER = """
import json, os, sys, traceback
report = {}
for page, folder, blocks in PAGES:
    os.chdir(folder)
    report[page] = None
    for name, code in blocks:
        try:
            exec(compile(code, name, "exec"), {"__name__": "__main__"})
        except BaseException:
            report[page] = f"block {name} failed:\\n" + traceback.format_exc()[-3000:]
            break
print(json.dumps(report))
"""

PYTHON_PAGES = sorted({block.page for block in PYTHON})


def run_pages(pages: list[str], with_onnx: bool, tmp_path_factory, tiny_folders) -> dict[str, str | None]:
    """Run the selected blocks of each page in one process; {page: None or the failure}."""
    jobs = []
    for page in pages:
        blocks = [block for block in PYTHON if block.page == page and runs(block) and needs_onnx(block) == with_onnx]
        if blocks:
            folder = tmp_path_factory.mktemp("page")
            prepare(folder, blocks, tiny_folders)
            jobs.append((page, str(folder), [(block.name, block.code) for block in blocks]))
    if not jobs:
        return {}
    result = subprocess.run(
        [sys.executable, "-c", f"PAGES = {jobs!r}\n{RUNNER}"], capture_output=True, text=True, timeout=300,
        env={**ENV, "PYTHONPATH": f"{ROOT}:{ROOT / 'runtime'}", "HF_HOME": str(tmp_path_factory.mktemp("hf"))},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def needs_onnx(block: Block) -> bool:
    # An ONNX export costs about half a minute of CPU: blocks that need one run under -m slow.
    return block.setup == "tiny_onnx"


@pytest.fixture(scope="session")
def python_results(tmp_path_factory, tiny_folders, help_process):
    return run_pages(PYTHON_PAGES, False, tmp_path_factory, tiny_folders)


@pytest.mark.parametrize("page", PYTHON_PAGES)
def test_python_blocks_run(page, python_results):
    blocks = [block for block in PYTHON if block.page == page]
    skipped = [f"{block.name} ({block.skip_reason or RUN_ELSEWHERE[page]})" for block in blocks if not runs(block)]
    skipped += [
        f"{block.name} (needs an ONNX export: -m slow)" for block in blocks if runs(block) and needs_onnx(block)
    ]
    if skipped:
        print("not run here:", *skipped, sep="\n  ")
    if page not in python_results:
        pytest.skip("; ".join(skipped))
    assert python_results[page] is None, python_results[page]


@pytest.mark.slow
def test_python_blocks_with_an_onnx_export_run(tmp_path_factory, tiny_folders):
    results = run_pages(PYTHON_PAGES, True, tmp_path_factory, tiny_folders)
    assert results and all(failure is None for failure in results.values()), results


def runs(block: Block) -> bool:
    return block.skip_reason is None and block.page not in RUN_ELSEWHERE


def test_excluded_blocks_are_named():
    """Every block not run carries a reason; the list is printed (pytest -s or -rA shows it)."""
    excluded = [(block.name, block.lang, block.skip_reason) for block in BLOCKS if block.skip_reason]
    for name, lang, reason in excluded:
        print(f"not run: {name} ({lang}): {reason}")
        assert reason and reason != "no reason given", name
    assert len(PYTHON) >= 5 and len(BASH) >= 20


def test_every_bash_block_is_run_or_marked():
    """A bash block either runs (`run`) or says why not (`skip REASON`)."""
    silent = [block.name for block in BASH if not runs_bash(block) and not block.skip_reason]
    assert not silent, f"bash blocks neither marked `run` nor `skip REASON`: {silent}"


# ---------------------------------------------------------------------------------------------- bash blocks


def command_lines(code: str) -> list[list[str]]:
    """Each simple command of a bash block as tokens: continuations joined, comments dropped, split at && ; |."""
    joined = re.sub(r"\\\n\s*", " ", code)
    commands = []
    for line in joined.splitlines():
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:  # an unbalanced quote in a placeholder: check what can be read
            tokens = line.split()
        current: list[str] = []
        for token in tokens:
            if token in {"&&", ";", "|", "||"}:
                commands.append(current)
                current = []
            else:
                current.append(token)
        commands.append(current)
    return [command for command in commands if command]


def command_and_flags(tokens: list[str]) -> tuple[str, list[str]] | None:
    """The program a command line runs (a vt-* name or `benchmarks.X`) and the flags given to it."""
    tokens = [token.strip("[]") for token in tokens]
    while tokens and re.match(r"^\w+=", tokens[0]):  # VAR=value prefixes
        tokens = tokens[1:]
    while tokens and tokens[0] in {"nice", "-n", "10", "time"}:
        tokens = tokens[1:]
    for position, token in enumerate(tokens):
        if token.startswith("vt-"):
            return token, tokens[position + 1 :]
        script = re.match(r"^(scripts|export)/(\w+)\.(py|sh)$", token)
        if script and position > 0:
            name = f"vt-{script.group(2).replace('_', '-')}"
            # a script with a console script of its own takes its flags; the others (paper_run.sh) take none
            return (name, tokens[position + 1 :]) if name in console_scripts() else None
        if token == "-m" and position + 1 < len(tokens):
            module = tokens[position + 1]
            if module.startswith("benchmarks."):
                return module, tokens[position + 2 :]
            if module == "vanilla_transformer_ort":
                return "vt-translate-onnx", tokens[position + 2 :]
            return None
    return None


def flags_of(arguments: list[str]) -> list[str]:
    return [argument.split("=")[0] for argument in arguments if re.match(r"^--[A-Za-z]", argument)]


def console_scripts() -> dict[str, str]:
    """The vt-* commands as pyproject.toml declares them (an environment's installed metadata can lag behind)."""
    section = (ROOT / "pyproject.toml").read_text().split("[project.scripts]")[1].split("\n[")[0]
    return dict(re.findall(r'^(vt-[\w-]+)\s*=\s*"([\w.]+:\w+)"', section, flags=re.M))


HELP_DUMPER = """
import contextlib, importlib, io, json, runpy, sys
scripts, out = json.loads(sys.argv[1]), {}
for name in sys.argv[2:]:
    buffer = io.StringIO()
    sys.argv = [name, "--help"]
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(io.StringIO()):
            if name.startswith("benchmarks."):
                runpy.run_module(name, run_name="__main__")
            else:
                module, function = scripts[name].split(":")
                getattr(importlib.import_module(module), function)()
    except SystemExit:
        pass
    except Exception as error:
        buffer.write(f"ERROR {type(error).__name__}: {error}")
    out[name] = buffer.getvalue() if name.startswith("benchmarks.") or name in scripts else None
print(json.dumps(out))
"""


@pytest.fixture(scope="session")
def help_process():
    """`--help` of every program the bash blocks name, from one process started first (it overlaps the rest)."""
    programs = sorted(
        {found[0] for block in BASH for tokens in command_lines(block.code) if (found := command_and_flags(tokens))}
    )
    process = subprocess.Popen(
        [sys.executable, "-c", HELP_DUMPER, json.dumps(console_scripts()), *programs], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**ENV, "PYTHONPATH": f"{ROOT}:{ROOT / 'runtime'}"},
    )  # fmt: skip
    yield process
    process.kill()


@pytest.fixture(scope="session")
def help_texts(help_process):
    stdout, stderr = help_process.communicate(timeout=300)
    assert help_process.returncode == 0, stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


def normalize(flag: str) -> str:
    return flag.replace("-", "_")


def flag_problems(code: str, help_texts: dict[str, str | None]) -> list[str]:
    problems = []
    for tokens in command_lines(code):
        found = command_and_flags(tokens)
        if not found:
            continue
        program, arguments = found
        text = help_texts.get(program)
        if text is None:
            problems.append(f"{program}: no such command")
            continue
        known = {normalize(flag) for flag in re.findall(r"--[A-Za-z][\w-]*", text)}
        problems += [
            f"{program} {flag}: not in --help" for flag in flags_of(arguments) if normalize(flag) not in known
        ]
    return problems


@pytest.mark.parametrize("block", BASH, ids=lambda block: block.name)
def test_bash_commands_and_flags_exist(block, help_texts):
    problems = flag_problems(block.code, help_texts)
    assert not problems, f"{block.name}: " + "; ".join(problems)


def test_flag_check_catches_a_wrong_flag_and_command():
    helps = {"vt-train": "usage: vt-train [--max_steps MAX_STEPS] [--output-dir DIR]", "vt-gone": None}
    assert flag_problems("vt-train --max-steps 5 --output_dir x\n", helps) == []
    assert flag_problems("python scripts/train.py --max_stepz 5\n", helps) == ["vt-train --max_stepz: not in --help"]
    assert flag_problems("vt-gone --x\n", helps) == ["vt-gone: no such command"]


def runs_bash(block: Block) -> bool:
    """Marked `run`, and not skipped: a skip reason may contain the word ("benchmarks run for minutes")."""
    return block.skip_reason is None and "run" in block.marker.split()


RUN_BASH = [
    pytest.param(block, id=block.name, marks=[pytest.mark.slow] if needs_onnx(block) else [])
    for block in BASH
    if runs_bash(block)
]


@pytest.mark.parametrize("block", RUN_BASH)
def test_marked_bash_blocks_run(block, tmp_path, tiny_folders):
    prepare(tmp_path, [block], tiny_folders)
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**ENV, "PYTHONPATH": f"{ROOT}:{ROOT / 'runtime'}", "HF_HOME": str(tmp_path / "hf")},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]


def test_parser_reads_fences_and_markers():
    """The extraction itself, on a page written here."""
    page = ROOT / "docs" / "index.md"
    blocks = read_blocks(page)
    assert blocks and all(block.page == "docs/index.md" for block in blocks)
    assert any(block.page == "benchmarks/README.md" for block in BASH)  # the benchmarks' commands are checked too
    assert command_and_flags(shlex.split("python scripts/train.py --max_steps 5")) == (
        "vt-train",
        ["--max_steps", "5"],
    )
    assert command_and_flags(shlex.split("VT_X=1 nice -n 10 python -m benchmarks.memory --rounds 2"))[0] == (
        "benchmarks.memory"
    )
    with contextlib.redirect_stdout(io.StringIO()):
        assert command_lines("a \\\n  --b c && vt-x --y # --z\n") == [["a", "--b", "c"], ["vt-x", "--y"]]
