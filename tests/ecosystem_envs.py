"""Virtual environments for tests that run another project's own code (Optimum, which pins an older transformers),
built once and cached under `${XDG_CACHE_HOME:-~/.cache}/vanilla-transformer/envs/<name>-<hash of its requirements>`.

`ecosystem_env(name, steps)` builds the environment the first time (`python -m venv`, then one `pip install` per
step, in order), into a temporary folder beside the cache entry that is renamed into place only once complete; a lock
file serialises two test processes that build it at once. It calls `pytest.skip` only when the package registry
cannot be reached (pip's own connection errors); any other failure fails the test.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# Markers of pip output when no package index could be reached (DNS, refused or timed-out connections, proxies).
UNREACHABLE_MARKERS = (
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "No route to host",
    "ConnectTimeoutError",
    "ReadTimeoutError",
    "ProxyError",
)
COMPLETE_MARKER = "ecosystem-env.json"  # written last into a finished environment
PIP_TIMEOUT_S = 900  # one `pip install` step


def cache_root() -> Path:
    """`${XDG_CACHE_HOME:-~/.cache}/vanilla-transformer/envs`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vanilla-transformer" / "envs"


def env_python(env: Path) -> Path:
    return env / "bin" / "python"


def requirements_hash(steps: list[list[str]]) -> str:
    """Identifies an environment: its pip steps and the Python that runs them."""
    key = json.dumps({"steps": steps, "python": sys.version_info[:2]}, sort_keys=True)
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def _is_complete(env: Path) -> bool:
    return (env / COMPLETE_MARKER).is_file() and env_python(env).exists()


def _pip(python: Path, args: list[str]) -> None:
    command = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--retries", "2", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    if result.returncode == 0:
        return
    output = result.stdout + result.stderr
    if any(marker in output for marker in UNREACHABLE_MARKERS):
        pytest.skip(f"the package registry cannot be reached (pip install {' '.join(args)}): "
                    f"{next(m for m in UNREACHABLE_MARKERS if m in output)}")  # fmt: skip
    raise RuntimeError(f"pip install {' '.join(args)} failed (exit {result.returncode}):\n{output[-4000:]}")


def ecosystem_env(name: str, steps: list[list[str]]) -> Path:
    """The cached virtual environment `name` with `steps` installed (each a `pip install` argument list, in order);
    built here the first time. Returns its folder; run its interpreter with `env_python(env)`."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    env = root / f"{name}-{requirements_hash(steps)}"
    if _is_complete(env):
        return env
    with open(root / f"{env.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second process waits here, then finds the finished environment
        if _is_complete(env):
            return env
        shutil.rmtree(env, ignore_errors=True)  # an incomplete leftover of an interrupted build
        building = root / f".{env.name}.building-{os.getpid()}"
        shutil.rmtree(building, ignore_errors=True)
        try:
            subprocess.run([sys.executable, "-m", "venv", str(building)], check=True, capture_output=True)
            for step in steps:
                _pip(env_python(building), step)
            (building / COMPLETE_MARKER).write_text(json.dumps({"steps": steps}, indent=1) + "\n")
            # Only `bin/python` is used (never the scripts, whose #! lines name the build folder), so the finished
            # environment can be renamed into place: python finds its site-packages from pyvenv.cfg beside it.
            os.rename(building, env)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return env
