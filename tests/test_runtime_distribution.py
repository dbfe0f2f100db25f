"""The runtime as its own distribution (runtime/pyproject.toml): no torch or transformers in its requirements, and it
imports and translates in an interpreter where torch and transformers cannot be imported; the slow test installs it
into a fresh virtual environment."""

import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.onnx_helpers import trained_export_dir
from vanilla_transformer_ort import OrtTranslator

REPO = Path(__file__).resolve().parents[1]
RUNTIME = REPO / "runtime"
# Packages that are torch, transformers, or pull one of them in.
TORCH_PACKAGES = {"torch", "torchvision", "torchaudio", "transformers", "accelerate", "optimum", "vanilla-transformer"}
# Installed as a `sys.meta_path` finder that refuses torch, transformers and the torch side of this repository.
BLOCK_IMPORTS = """
import sys

class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers", "vanilla_transformer"):
            raise ImportError(f"{name} is blocked in this test")
        return None

sys.meta_path.insert(0, Blocked())
"""


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~\[;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_metadata_lists_no_torch_package():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((RUNTIME / "pyproject.toml").read_text())["project"]
    assert project["name"] == "vanilla-transformer-ort"
    root = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["version"] == root["version"] and project["requires-python"] == ">=3.10"
    requirements = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        requirements += extra
    names = {_requirement_name(r) for r in requirements}
    assert {"numpy", "tokenizers", "onnxruntime", "onnxruntime-gpu"} <= names
    assert not names & TORCH_PACKAGES, names
    assert project["scripts"]["vt-translate-onnx"] == "vanilla_transformer_ort.cli:main"


def test_serve_extra_is_the_same_in_both_distributions_with_uvicorns_fast_loop_and_parser():
    """`vt-serve` installs alike from either distribution, and with uvicorn's `standard` extra: uvloop and httptools,
    which uvicorn picks when installed (the served figures were measured with them; docs/serving.md)."""
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement

    runtime = tomllib.loads((RUNTIME / "pyproject.toml").read_text())["project"]["optional-dependencies"]["serve"]
    root = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["serve"]
    assert sorted(runtime) == sorted(root)
    uvicorn = next(Requirement(r) for r in runtime if _requirement_name(r) == "uvicorn")
    assert "standard" in uvicorn.extras


def test_imports_and_translates_where_torch_and_transformers_are_blocked(tmp_path):
    """Only runtime/ on the path (not the repository root), torch and transformers refused by an import hook."""
    folder = trained_export_dir()
    code = BLOCK_IMPORTS + (
        "import vanilla_transformer_ort\n"
        "from vanilla_transformer_ort.cli import main\n"
        f"main([{str(folder)!r}, 'a b c', 'q r s', '--num-beams', '2', '--provider', 'cpu'])\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'vanilla_transformer')]\n"
        "assert not loaded, loaded\n"
    )
    env = {**os.environ, "PYTHONPATH": str(RUNTIME)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    expected = OrtTranslator(folder, provider="cpu").translate(["a b c", "q r s"], num_beams=2)
    assert result.stdout.splitlines() == expected


@pytest.mark.slow
def test_installs_alone_into_a_fresh_environment(tmp_path):
    """`pip install ./runtime[cpu]` (needs the package index), then `vt-translate-onnx` in that environment."""
    source = tmp_path / "runtime"  # a copy, so the build leaves nothing in the checkout
    shutil.copytree(RUNTIME, source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    environment = tmp_path / "venv"
    venv.create(environment, with_pip=True)
    bin_dir = environment / ("Scripts" if os.name == "nt" else "bin")
    python = bin_dir / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", f"{source}[cpu]"], capture_output=True, text=True, env=env
    )
    assert install.returncode == 0, install.stderr[-3000:]
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True)
    installed = {_requirement_name(line) for line in listed.stdout.splitlines() if line.strip()}
    assert "vanilla-transformer-ort" in installed and "onnxruntime" in installed
    assert not installed & TORCH_PACKAGES, sorted(installed)
    folder = trained_export_dir()
    result = subprocess.run(
        [str(bin_dir / "vt-translate-onnx"), str(folder), "a b c", "--provider", "cpu"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == OrtTranslator(folder, provider="cpu").translate(["a b c"])
