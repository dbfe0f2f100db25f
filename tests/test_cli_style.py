"""One command-line style for every console script of pyproject.toml: `--help` with an example, `--version`, the
`--kebab-case` alias of each `--snake_case` flag, and user errors as one line on stderr with exit status 2.

The commands run in this process through their console-script functions (a couple through a subprocess); no row
trains or loads a model, so the module takes seconds.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

import vanilla_transformer
import vanilla_transformer_ort
from vanilla_transformer_ort.cli_common import UserError, add_flag_alias, make_parser, run_cli

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
RUNTIME_PROJECT = tomllib.loads((ROOT / "runtime" / "pyproject.toml").read_text())["project"]
SCRIPTS = PROJECT["scripts"]


def console_script(name: str):
    """The function `[project.scripts]` names for `name`."""
    module, _, attribute = SCRIPTS[name].partition(":")
    return getattr(importlib.import_module(module), attribute)


def run(name: str, argv: list[str], capsys) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of console script `name` called with `argv` (as `sys.exit(main())` would)."""
    try:
        status = console_script(name)(argv)
    except SystemExit as exit_info:
        status = exit_info.code
    captured = capsys.readouterr()
    return (0 if status is None else status), captured.out, captured.err


def assert_one_line_error(status: int, err: str, *words: str) -> None:
    assert status == 2, f"exit {status}: {err}"
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}: {err!r}"
    assert "error" in lines[0], lines[0]
    message = lines[0].split("error: ", 1)[-1]
    # one style (git's): starts lower-case unless with a name, path or flag; no closing full stop
    first = message.split(" ", 1)[0]
    assert not (first[:1].isupper() and first[1:].isalpha() and first[1:].islower()), lines[0]
    assert not message.endswith(".") or message.endswith(".."), lines[0]
    for word in words:
        assert word in lines[0], f"{word!r} not in {lines[0]!r}"


def test_every_version_agrees():
    """One version: both distributions' pyproject `version` and both packages' `__version__`."""
    assert PROJECT["version"] == RUNTIME_PROJECT["version"]
    assert vanilla_transformer.__version__ == vanilla_transformer_ort.__version__ == PROJECT["version"]
    assert set(RUNTIME_PROJECT["scripts"].items()) <= set(SCRIPTS.items())  # the runtime's commands are the same


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_help_shows_an_example(name, capsys):
    status, out, _ = run(name, ["--help"], capsys)
    assert status == 0
    assert "usage" in out and "example" in out.lower() and name in out
    assert "--version" in out


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_version_prints_the_package_version(name, capsys):
    status, out, _ = run(name, ["--version"], capsys)
    assert status == 0
    assert vanilla_transformer_ort.__version__ in out


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_unknown_flag_is_one_line_and_exit_2(name, capsys):
    status, _, err = run(name, ["--no_such_flag"], capsys)
    assert_one_line_error(status, err)  # names the flag, or first the required flags that are missing


def _not_an_export(tmp: Path) -> Path:
    folder = tmp / "empty"
    folder.mkdir()
    export = tmp / "export"  # looks like an ONNX export: where a model folder is wanted, it is refused as one
    export.mkdir()
    for name in ("encoder_model.onnx", "config.json"):
        (export / name).write_text("{}")
    return folder


# (command, argv with {tmp} for the test's folder, words the one error line must hold)
BAD_INPUTS = [
    ("vt-translate-onnx", ["--model", "{tmp}/missing", "a b"], ["--model", "does not exist"]),
    ("vt-translate-onnx", ["{tmp}/missing", "a b"], ["does not exist"]),  # the older, positional spelling
    ("vt-translate-onnx", ["--model", "{tmp}/empty", "a b"], ["encoder_model.onnx"]),
    ("vt-translate-onnx", ["--model", "{tmp}/empty", "--batch_size", "zero", "a"], ["--batch_size", "zero"]),
    ("vt-translate-onnx", ["--model", "{tmp}/empty", "--num-beams", "0", "a"], ["--num_beams", ">= 1"]),
    ("vt-translate-onnx", ["--model", "{tmp}/empty", "--input", "{tmp}/missing.txt"], ["--input", "missing.txt"]),
    ("vt-translate-onnx", [], ["--model"]),
    ("vt-evaluate", ["--model", "{tmp}/empty", "--test_file", "t.tsv"], ["not a model folder", "config.json"]),
    ("vt-evaluate", ["--model", "{tmp}/empty", "--test_file", "t.tsv", "--batch_size", "x"], ["--batch_size"]),
    ("vt-evaluate", ["--model", "{tmp}/missing", "--test_file", "{tmp}/missing.tsv"], ["--model", "no such folder"]),
    ("vt-evaluate", ["--model", "{tmp}/export", "--test_file", "t.tsv"], ["ONNX export folder", "--model"]),
    ("vt-translate", ["--model", "{tmp}/empty", "--input", "{tmp}/missing.txt"], ["--input", "does not exist"]),
    ("vt-translate", ["--model", "{tmp}/empty", "--input-file", "{tmp}/in.txt"], ["not a model folder"]),
    ("vt-average-checkpoints", ["--run_dir", "{tmp}/missing", "--output", "{tmp}/avg"], ["not found"]),
    (
        "vt-average-checkpoints",
        ["--run_dir", "{tmp}", "--output_dir", "{tmp}/a", "--num_checkpoints", "0"],
        [">= 1"],
    ),  # fmt: skip
    ("vt-train-tokenizer", ["--output", "{tmp}/tok", "--vocab_size", "many"], ["--vocab_size", "many"]),
    ("vt-train-tokenizer", ["--output", "{tmp}/tok", "--train_file", "{tmp}/no.tsv"], ["data file", "check the path"]),
    (
        "vt-prepare-data",
        ["--train_file", "{tmp}/no.tsv", "--tokenizer_name", "{tmp}", "--output", "{tmp}/p"],
        ["data file", "check the path"],
    ),
    ("vt-prepare-data", ["--train_file", "t.tsv", "--tokenizer_name", "{tmp}"], ["--output"]),
    ("vt-prepare-data", ["--output", "{tmp}/p", "--tokenizer_name", "{tmp}"], ["--train_file", "--dataset_name"]),
    ("vt-train", ["--output", "{tmp}/run", "--max_steps", "abc"], ["--max_steps", "abc"]),
    ("vt-train", ["--output_dir", "{tmp}/run", "--fp16", "--bf16"], ["--fp16 and --bf16"]),
    ("vt-main-job", ["--output", "{tmp}/job", "--time-budget-minutes", "soon"], ["--time_budget_minutes", "soon"]),
    ("vt-convert-marian", ["--model", "{tmp}/empty", "--output", "{tmp}/out"], ["config.json"]),
    ("vt-export-marian", ["--model", "{tmp}/missing", "--output", "{tmp}/out"], ["--model", "no such folder"]),
    ("vt-export-marian", ["--model", "{tmp}/empty", "--output", "{tmp}/out"], ["not a model folder", "config.json"]),
    ("vt-export-marian", ["--model", "{tmp}/export", "--output", "{tmp}/out"], ["ONNX export folder", "--model"]),
    ("vt-push-to-hub", ["--model", "{tmp}/missing", "--repo_id", "u/m", "--dry_run", "{tmp}/hub"], ["missing"]),
    ("vt-push-to-hub", ["--model", "{tmp}/empty", "--repo-id", "u/m", "--dry-run", "{tmp}/hub"], ["config.json"]),
    ("vt-export-onnx", ["--model", "{tmp}/missing", "--output", "{tmp}/onnx"], ["--model", "no such folder"]),
    ("vt-export-onnx", ["--model", "{tmp}/export", "--output", "{tmp}/onnx"], ["ONNX export folder", "--model"]),
    ("vt-export-onnx", ["--model", "{tmp}/empty", "--output", "{tmp}/onnx", "--dtype", "int4"], ["--dtype", "int4"]),
    ("vt-export-ctranslate2", ["--model", "{tmp}/missing", "--output", "{tmp}/ct2"], ["--model", "no such folder"]),
    (
        "vt-export-ctranslate2",
        ["--model", "{tmp}/empty", "--output", "{tmp}/ct2", "--max_positions", "x"],
        ["--max_positions"],
    ),  # fmt: skip
]


@pytest.mark.parametrize(
    ("name", "argv", "words"), BAD_INPUTS, ids=[f"{row[0]}-{i}" for i, row in enumerate(BAD_INPUTS)]
)
def test_bad_input_is_one_line_and_exit_2(name, argv, words, tmp_path, capsys):
    _not_an_export(tmp_path)
    (tmp_path / "in.txt").write_text("a b\n")
    status, _, err = run(name, [arg.format(tmp=tmp_path) for arg in argv], capsys)
    assert_one_line_error(status, err, *words)


def test_every_script_has_bad_input_rows():
    """Each console script of this project has rows above (the others' `vt-*` commands only the generic ones)."""
    covered = {row[0] for row in BAD_INPUTS}
    ours = {name for name, target in SCRIPTS.items() if target.split(":")[0].endswith(("cli", "export.cli"))}
    ours -= {name for name, target in SCRIPTS.items() if ".serve." in target or ".gettext." in target}
    assert ours <= covered, ours - covered


def test_flags_a_command_lacks_are_never_named():
    """A data-file error of one command does not name another command's flags (--train_file, --validation_file)."""
    from vanilla_transformer.training.pair_reader import read_parallel_file

    with pytest.raises(FileNotFoundError) as error:
        read_parallel_file("no/such.tsv", "en", "de")
    assert "--" not in str(error.value) and "no/such.tsv" in str(error.value)


@pytest.mark.parametrize(
    "name", sorted(name for name, target in SCRIPTS.items() if "vanilla_transformer_ort" not in target)
)
def test_version_answers_without_importing_torch(name):
    """`--version` of every command of the full package answers from its launcher, before torch is imported
    (`import vanilla_transformer` takes seconds; the runtime's commands never import torch at all)."""
    module, _, function = SCRIPTS[name].partition(":")
    code = (
        f"import sys; from {module} import {function}; status = {function}(['--version']); "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'imported torch'; sys.exit(status)"
    )
    result = _run_subprocess("-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{name} {vanilla_transformer_ort.__version__}\n"


def test_error_style():
    from vanilla_transformer_ort.cli_common import error_style

    assert error_style("Cannot open x.") == "cannot open x"
    assert error_style("ONNX export is missing.") == "ONNX export is missing"
    assert error_style("/tmp/x: no such folder") == "/tmp/x: no such folder"
    assert error_style("wait...") == "wait..."
    assert error_style("Model folder\n  x") == "model folder x"


def test_old_flag_spellings_still_work():
    """`--output_dir`, `--input_file`, `--output_file` and `--kebab-case` stay accepted where they were."""
    from vanilla_transformer_ort.cli import build_parser

    args = build_parser().parse_args(["F", "t", "--num-beams", "3", "--batch-size", "4", "--max-new-tokens", "5"])
    assert (args.text, args.num_beams, args.batch_size, args.max_new_tokens) == (["F", "t"], 3, 4, 5)
    args = build_parser().parse_args(["--model", "F", "--num_beams", "3", "--length-penalty", "0.5"])
    assert (args.model, args.text, args.num_beams, args.length_penalty) == ("F", [], 3, 0.5)


def test_help_lists_each_flag_once(capsys):
    status, out, _ = run("vt-translate-onnx", ["--help"], capsys)
    assert status == 0 and "--num_beams" in out and "--num-beams NUM" not in out and "--kebab-case" in out


def _run_subprocess(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'runtime'}", **(env or {})}
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=environment, cwd=ROOT)


def test_subprocess_exit_status_and_debug(tmp_path):
    """As a process: one line and status 2; `--debug` (or VT_DEBUG=1) shows the traceback instead."""
    missing = str(tmp_path / "missing")
    plain = _run_subprocess("-m", "vanilla_transformer_ort", "--model", missing, "a b")
    assert plain.returncode == 2 and plain.stderr.count("\n") == 1 and "Traceback" not in plain.stderr
    assert plain.stderr.startswith("vt-translate-onnx: error: export folder") and plain.stdout == ""
    debug = _run_subprocess("-m", "vanilla_transformer_ort", "--model", missing, "a b", "--debug")
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "UserError" in debug.stderr
    environment = _run_subprocess("scripts/translate_onnx.py", missing, "a", env={"VT_DEBUG": "1"})
    assert environment.returncode == 1 and "Traceback" in environment.stderr


def test_scripts_report_errors_like_the_console_scripts(tmp_path):
    """`python scripts/train.py` runs the console script: a user error is one line and status 2."""
    result = _run_subprocess("scripts/train.py", "--tokenizer_name", str(tmp_path / "x"), "--output_dir", "o")
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"vt-train: error: tokenizer folder {tmp_path / 'x'} does not exist")


def test_bugs_keep_their_traceback(capsys):
    """Only user errors become one line: any other exception type is a bug and propagates."""

    def buggy(argv):
        raise KeyError("oops")

    with pytest.raises(KeyError):
        run_cli(buggy, [], prog="vt-x")

    def user_mistake(argv):
        raise UserError("bad --thing 3; pass 1 or 2\n(more)")

    assert run_cli(user_mistake, [], prog="vt-x") == 2
    assert capsys.readouterr().err == "vt-x: error: bad --thing 3; pass 1 or 2 (more)\n"
    with pytest.raises(UserError):
        run_cli(user_mistake, ["--debug"], prog="vt-x")
    assert run_cli(lambda argv: argv, ["a", "--debug"], prog="vt-x") == 0  # --debug is run_cli's, not the command's


def test_parser_helpers():
    parser = make_parser("vt-x", "Does x.", "vt-x --a_b 1", "9.9")
    parser.add_argument("--a_b", type=int)
    parser.add_argument("--output_dir")
    add_flag_alias(parser, "--output_dir", "--output")
    args = parser.parse_args(["--a-b", "2", "--output", "o"])
    assert (args.a_b, args.output_dir) == (2, "o")
    with pytest.raises(ValueError, match="no option --nope"):
        add_flag_alias(parser, "--nope", "--n")
    assert "example:\n  vt-x --a_b 1" in parser.format_help()


def test_missing_onnxruntime_names_the_extra(tmp_path):
    """`pip install vanilla-transformer-ort` without an extra has no onnxruntime: the error says what to install,
    from the library and, as one line, from the command."""
    from tokenizers import Tokenizer, models

    folder = tmp_path / "export"
    folder.mkdir()
    for name in ("encoder_model.onnx", "decoder_model.onnx", "cache_reorder.onnx", "beam_scores.onnx"):
        (folder / name).write_bytes(b"")
    (folder / "config.json").write_text('{"decoder_start_token_id": 0}')
    (folder / "manifest.json").write_text('{"format": "vanilla-transformer-onnx", "format_version": 2}')
    Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>")).save(str(folder / "tokenizer.json"))
    code = (
        "import sys; sys.modules['onnxruntime'] = None\n"
        "import vanilla_transformer_ort\n"
        "from vanilla_transformer_ort import OrtTranslator\n"
        "try:\n"
        f"    OrtTranslator({str(folder)!r})\n"
        "except ImportError as error:\n"
        "    print(error)\n"
        "from vanilla_transformer_ort.cli import main\n"
        f"sys.exit(main(['--model', {str(folder)!r}, 'a']))\n"
    )
    result = _run_subprocess("-c", code)
    hint = 'pip install onnxruntime (onnxruntime-gpu for CUDA); from a checkout, pip install "./runtime[cpu]"'
    assert hint in result.stdout, result.stdout + result.stderr
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and '"./runtime[gpu]"' in result.stderr


# The modules each optional extra of the two distributions brings (the gpu extra is onnxruntime under another name;
# dev and docs are for working on the project).
OPTIONAL_MODULES = {
    "train": ["accelerate", "datasets", "evaluate", "sacrebleu", "tensorboard", "matplotlib"],
    "onnx": ["onnx", "onnxscript", "onnxruntime"],
    "cpu": ["onnxruntime"],
    "ctranslate2": ["ctranslate2"],
    "marian": ["sentencepiece"],
    "serve": ["fastapi", "uvicorn", "prometheus_client", "python_multipart", "multipart", "uvloop", "httptools"],
    "ray": ["ray"],
}
# Makes the optional modules unimportable in a fresh interpreter, as on a machine without the extras.
HIDDEN = sorted({name for names in OPTIONAL_MODULES.values() for name in names})
HIDE_OPTIONAL = f"import sys\nfor name in {HIDDEN!r}:\n    sys.modules[name] = None\n"


def test_every_help_works_without_the_optional_extras():
    """`--help` of every console script answers (status 0, its usage) with no optional package importable."""
    extras = {*PROJECT["optional-dependencies"], *RUNTIME_PROJECT["optional-dependencies"]} - {"gpu", "dev", "docs"}
    assert extras == set(OPTIONAL_MODULES), "a new extra: list its modules in OPTIONAL_MODULES"
    code = HIDE_OPTIONAL + (
        "import contextlib, importlib, io, json\n"
        "statuses = {}\n"
        f"for name, target in {SCRIPTS!r}.items():\n"
        "    module, _, function = target.partition(':')\n"
        "    out = io.StringIO()\n"
        "    try:\n"
        "        with contextlib.redirect_stdout(out):\n"
        "            status = getattr(importlib.import_module(module), function)(['--help'])\n"
        "    except SystemExit as exit_info:\n"
        "        status = exit_info.code\n"
        "    statuses[name] = [status, out.getvalue().startswith('usage: ' + name)]\n"
        "print(json.dumps(statuses))\n"
    )
    result = _run_subprocess("-c", code)
    assert result.returncode == 0, result.stderr
    statuses = json.loads(result.stdout.strip().splitlines()[-1])
    assert statuses == {name: [0, True] for name in SCRIPTS}, result.stderr


def test_a_missing_ctranslate2_names_its_extra(tmp_path):
    """vt-export-ctranslate2 without ctranslate2: one line naming the package and the extra that installs it."""
    code = HIDE_OPTIONAL + (
        "from vanilla_transformer_cli import export_ctranslate2_main\n"
        f"sys.exit(export_ctranslate2_main(['--model', {str(tmp_path)!r}, '--output', {str(tmp_path / 'ct2')!r}]))\n"
    )
    result = _run_subprocess("-c", code)
    assert_one_line_error(
        result.returncode, result.stderr, "ctranslate2 is missing", "pip install -e '.[ctranslate2]'"
    )


def test_exporter_noise_is_hidden_unless_debug(capsys, caplog):
    """vt-export-onnx keeps torch's exporter quiet (progress prints, warnings, log records); `--debug` shows them."""
    import logging
    import warnings

    from vanilla_transformer.export.cli import quiet_exporter
    from vanilla_transformer_ort.cli_common import debug_requested

    def noisy():
        print("[torch.onnx] Run decompositions...")
        warnings.warn("axis name batch_size will not be used", UserWarning, stacklevel=1)
        logging.getLogger("torch.onnx._internal").warning("torchvision is not installed")

    with quiet_exporter(True), warnings.catch_warnings(record=True) as caught:
        noisy()
    assert capsys.readouterr().out == "" and not caught and not caplog.records
    with quiet_exporter(False), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        noisy()
    assert "[torch.onnx]" in capsys.readouterr().out and len(caught) == 1 and len(caplog.records) == 1
    assert logging.getLogger("torch.onnx").level == logging.NOTSET  # levels restored
    seen = []
    run_cli(lambda argv: seen.append(debug_requested()), ["--debug"], prog="vt-x")
    run_cli(lambda argv: seen.append(debug_requested()), [], prog="vt-x")
    assert seen == [True, False] and not debug_requested()
