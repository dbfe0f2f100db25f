"""The README's code cannot rot: its Python blocks run, its two commands exist, and CI runs its test command."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)
BASH_LINES = [
    line.strip() for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S) for line in block.splitlines()
]


def test_readme_has_python_blocks():
    assert len(PYTHON_BLOCKS) >= 3


@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_readme_python_block_runs(index, tmp_path):
    # Blocks run in order in one folder, so a later block can load what an earlier one saved.
    code = "\n".join(PYTHON_BLOCKS[: index + 1])
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HF_HOME": str(tmp_path / "hf")},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]


def test_readme_names_the_main_job_command():
    main_job = next(line for line in BASH_LINES if line.startswith("bash scripts/main_job.sh"))
    assert (ROOT / main_job.split()[1]).is_file()
    assert "vt-main-job" in main_job  # the same job where the environment is set up already


def test_ci_runs_the_readme_test_command():
    test_command = next(line for line in BASH_LINES if "pytest" in line)
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_command in ci
    # A fresh machine: a virtual environment, the pinned CPU torch wheel first, then the package with its extras.
    assert test_command.startswith("python3 -m venv .venv && . .venv/bin/activate && pip install -q torch==")
    assert test_command.index("torch==") < test_command.index('pip install -q -e ".[')
    assert test_command.endswith("python -m pytest")


def test_ci_builds_the_docs_strictly_when_the_test_command_installs_them():
    test_command = next(line for line in BASH_LINES if "pytest" in line)
    if ",docs" in test_command:
        assert "mkdocs build --strict" in (ROOT / ".ci" / "run").read_text()
