"""transformers.js at the versions `package-lock.json` pins, installed once with `npm ci` into a cache folder.

The folder is `${XDG_CACHE_HOME:-~/.cache}/vanilla-transformer/js/<hash of package-lock.json>`, so a changed pin
installs afresh and an unchanged one is reused by every later run. Standard library only: the browser example's
server (examples/browser/serve.py) imports it too, to find the files it serves.

    python tests/js/npm_cache.py                  # install if needed, print the node_modules folder
    node "$(python tests/js/npm_cache.py translate.mjs)" MODEL_DIR < sentences  # run a script of tests/js with it
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
PACKAGE_FILES = ("package.json", "package-lock.json")
# What a complete installation holds (npm writes it last; a folder without it is an interrupted install).
COMPLETE_MARKER = "node_modules/.package-lock.json"
TRANSFORMERS = "node_modules/@huggingface/transformers"
ORT_WEB = "node_modules/onnxruntime-web"
PINNED_PACKAGE = "@huggingface/transformers"
NPM_TIMEOUT_S = 600
PROBE_TIMEOUT_S = 60


class RegistryUnreachable(RuntimeError):
    """The npm registry does not answer (an offline machine): transformers.js cannot be installed."""


def cache_root() -> Path:
    """`${XDG_CACHE_HOME:-~/.cache}/vanilla-transformer/js`."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "vanilla-transformer" / "js"


def lock_digest() -> str:
    """First 16 hex digits of the SHA-256 of package.json and package-lock.json."""
    digest = hashlib.sha256()
    for name in PACKAGE_FILES:
        digest.update((PACKAGE_DIR / name).read_bytes())
    return digest.hexdigest()[:16]


def install_dir() -> Path:
    """Where this pin's `node_modules` lives (whether or not it is installed yet)."""
    return cache_root() / lock_digest()


def _run_npm(npm: str, args: list[str], cwd: Path, timeout: int) -> subprocess.CompletedProcess:
    # Install scripts stay off: onnxruntime-node ships its CPU binaries in the package and its script would only
    # fetch GPU libraries from outside the registry.
    env = {**os.environ, "ONNXRUNTIME_NODE_INSTALL": "skip", "npm_config_update_notifier": "false"}
    return subprocess.run([npm, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _check_registry(npm: str, cwd: Path) -> None:
    """Raise RegistryUnreachable unless the registry answers a metadata request for the pinned package (one try)."""
    args = ["view", f"{PINNED_PACKAGE}@{pinned_version()}", "version", "--fetch-retries=0", "--fetch-timeout=30000"]
    try:
        probe = _run_npm(npm, args, cwd, PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RegistryUnreachable(f"the npm registry did not answer within {PROBE_TIMEOUT_S} s") from None
    if probe.returncode != 0:
        raise RegistryUnreachable(f"the npm registry cannot be reached: {probe.stderr.strip()[-500:]}")


def pinned_version() -> str:
    """The transformers.js version package.json pins."""
    return json.loads((PACKAGE_DIR / "package.json").read_text())["dependencies"][PINNED_PACKAGE]


def ensure_installed(log=None) -> Path:
    """The installed folder (with `node_modules/`), running `npm ci` first when this pin is not in the cache.

    Args:
        log: called with a line of progress when npm has to run (e.g. `print`); silent when None.
    Raises:
        RegistryUnreachable: the registry does not answer a request for the pinned package's metadata.
        RuntimeError: npm is missing, or `npm ci` failed while the registry answers.
    """
    target = install_dir()
    if (target / COMPLETE_MARKER).is_file():
        return target
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed (transformers.js is installed with `npm ci`); install Node.js 20+")
    cache_root().mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{target.name}.partial-", dir=cache_root()))
    try:
        for name in PACKAGE_FILES:
            shutil.copy2(PACKAGE_DIR / name, staging / name)
        _check_registry(npm, staging)
        if log:
            log(f"npm ci: installing transformers.js into {target}")
        args = ["ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"]
        result = _run_npm(npm, args, staging, NPM_TIMEOUT_S)
        if result.returncode != 0:
            output = (result.stderr or result.stdout)[-2000:]
            raise RuntimeError(f"`npm ci` failed (exit {result.returncode}): {output}")
        try:
            os.rename(staging, target)  # atomic: a concurrent run sees either nothing or a complete folder
        except OSError:
            if not (target / COMPLETE_MARKER).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def browser_files(installed: Path) -> dict[str, Path]:
    """The files a web page needs to run transformers.js from its own server, by the name it serves them under.

    `transformers.min.js` is transformers.js's browser bundle (onnxruntime-web inside it); onnxruntime-web's
    WebAssembly runtime is the pair of files its bundle loads (`env.backends.onnx.wasm.wasmPaths`), taken from the
    onnxruntime-web version transformers.js pins, since they must match the bundled JavaScript exactly.
    """
    files = {
        "transformers.min.js": installed / TRANSFORMERS / "dist" / "transformers.min.js",
        "ort-wasm-simd-threaded.asyncify.mjs": installed / ORT_WEB / "dist" / "ort-wasm-simd-threaded.asyncify.mjs",
        "ort-wasm-simd-threaded.asyncify.wasm": installed / ORT_WEB / "dist" / "ort-wasm-simd-threaded.asyncify.wasm",
    }
    missing = [str(path) for path in files.values() if not path.is_file()]
    if missing:
        raise RuntimeError(f"The transformers.js installation in {installed} lacks {', '.join(missing)}")
    return files


def runnable_script(installed: Path, name: str) -> Path:
    """A copy of `tests/js/<name>` beside the installed `node_modules`, where Node resolves its imports."""
    source = PACKAGE_DIR / name
    if not source.is_file():
        raise ValueError(f"No script {name} in {PACKAGE_DIR}")
    copy = installed / name
    if not copy.is_file() or copy.read_bytes() != source.read_bytes():
        partial = installed / f".{name}.{os.getpid()}"
        shutil.copyfile(source, partial)
        os.replace(partial, copy)
    return copy


if __name__ == "__main__":
    installed = ensure_installed(log=lambda line: print(line, file=sys.stderr))
    print(runnable_script(installed, sys.argv[1]) if len(sys.argv) > 1 else installed / "node_modules")
