"""The README's code cannot rot: its Python blocks run, and CI runs its test command."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


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


def test_ci_runs_the_readme_test_command():
    bash_blocks = re.findall(r"```bash\n(.*?)```", README, flags=re.S)
    test_command = next(line for block in bash_blocks for line in block.splitlines() if "pytest" in line)
    assert test_command.strip() in (ROOT / ".ci" / "run").read_text()
