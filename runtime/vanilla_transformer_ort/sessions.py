"""onnxruntime sessions: execution providers, session options and the CPU provider's skipped fusions."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
# onnxruntime session config entries set by default (see `session_options`).
DEFAULT_SESSION_CONFIG = {"session.force_spinning_stop": "1"}
# onnxruntime graph fusions skipped on the CPU provider (see `create_session`): their fused kernels are slower here.
CPU_DISABLED_OPTIMIZERS = ("SkipLayerNormFusion", "MatMulScaleFusion")
INSTALL_HINT = (
    'pip install onnxruntime (onnxruntime-gpu for CUDA); from a checkout, pip install "./runtime[cpu]" (or '
    '"./runtime[gpu]")'
)


def import_onnxruntime():
    """The `onnxruntime` module; an ImportError that names the extra to install where it is missing.

    The runtime's own dependencies leave onnxruntime to one of two extras (`cpu`: onnxruntime, `gpu`:
    onnxruntime-gpu), so a plain `pip install vanilla-transformer-ort` has none.
    """
    try:
        import onnxruntime
    except ImportError as error:
        raise ImportError(f"vanilla_transformer_ort needs onnxruntime, which is not installed: {INSTALL_HINT}",
                          name="onnxruntime") from error  # fmt: skip
    return onnxruntime


def resolve_provider(provider: str) -> str:
    """'auto', 'cpu', 'cuda' (or a full EP name) -> the execution provider to ask for."""
    ort = import_onnxruntime()

    aliases = {**PROVIDERS, **{v.lower(): v for v in PROVIDERS.values()}}
    available = ort.get_available_providers()
    key = provider.lower()
    if key == "auto":
        return PROVIDERS["cuda"] if PROVIDERS["cuda"] in available else PROVIDERS["cpu"]
    if key not in aliases:
        raise ValueError(f"Unknown provider {provider!r}: expected 'auto', 'cpu' or 'cuda'")
    name = aliases[key]
    if name not in available:
        raise ValueError(
            f"Provider {provider!r} is not available in this onnxruntime build (available: {available}); "
            "for CUDA install the package's `gpu` extra (onnxruntime-gpu) in an environment without onnxruntime"
        )
    return name


# onnxruntime's process-wide CPU arena (`register_shared_cpu_arena`), registered at most once per process.
_SHARED_ARENA = {"registered": False}


def register_shared_cpu_arena() -> None:
    """Register one onnxruntime CPU arena for the whole process; sessions opt in with `session.use_env_allocators`.

    Every session that opts in (all the sessions of every `OrtTranslator` on CPU, by default) then takes its
    intermediate tensors from this one arena, which grows by powers of two and reuses its chunks: no per-session
    arena, and no memory the C allocator keeps per thread after each step's large frees. At base size, beam 4,
    batch 16, the peak fell from 509 to 461 MiB (fp32) and from 318 to 274 MiB (int8) against no arena, with the
    same tokens. An arena registered earlier by the application is used as it is.
    """
    ort = import_onnxruntime()

    if _SHARED_ARENA["registered"]:
        return
    info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    try:
        ort.create_and_register_allocator(info, ort.OrtArenaCfg({"arena_extend_strategy": 0}))  # next power of two
    except Exception as error:  # noqa: BLE001 - onnxruntime raises its own Fail type
        if "already" not in str(error).lower():
            raise
    _SHARED_ARENA["registered"] = True


def session_options(
    intra_op_num_threads: int,
    enable_cpu_mem_arena: bool = False,
    config_entries: dict[str, str] | None = None,
    shared_cpu_arena: bool = False,
):
    """Explicit threads (the default spins on every core), all graph optimizations (less two CPU fusions, see
    `create_session`), the CPU arena off, and threads that stop spinning when a run ends.

    Without the arena, onnxruntime frees intermediate tensors instead of keeping the largest size it ever needed:
    a lower peak at the same speed. onnxruntime's worker threads spin between the operators of a run (kept: it is
    faster) and, by default, for a while after it; that spinning took a core from the first decoder steps after the
    encoder's run, so it stops when a run ends (`session.force_spinning_stop`; measured in docs/onnx.md,
    "Providers and threads"). `config_entries` are passed to `SessionOptions.add_session_config_entry` and override
    these defaults, e.g. `{"session.intra_op.allow_spinning": "0"}` on a machine shared with other jobs.
    `shared_cpu_arena`: allocate from the process's one CPU arena (`register_shared_cpu_arena`), whatever
    `enable_cpu_mem_arena` says.
    """
    ort = import_onnxruntime()

    if intra_op_num_threads < 1:
        raise ValueError(f"intra_op_num_threads must be >= 1, got {intra_op_num_threads}")
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_num_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_cpu_mem_arena = enable_cpu_mem_arena or shared_cpu_arena
    entries = {**DEFAULT_SESSION_CONFIG, **(config_entries or {})}
    if shared_cpu_arena:
        register_shared_cpu_arena()
        entries = {"session.use_env_allocators": "1", **entries}
    for key, value in entries.items():
        options.add_session_config_entry(key, str(value))
    return options


def create_session(
    path: str | os.PathLike, options, providers: list[str], disabled_optimizers: Sequence[str] | None = None
):
    """An `onnxruntime.InferenceSession` for `path`, without the graph fusions that are slower on CPU.

    `disabled_optimizers=None` skips `CPU_DISABLED_OPTIMIZERS` when the first provider is the CPU one and nothing
    otherwise; `()` keeps every fusion. On CPU both fused kernels are slower than the operators they replace
    (measured in docs/onnx.md, "Providers and threads"):
    - `SkipLayerNormFusion` merges each residual `Add` with the `LayerNormalization` after it into one
      `SkipLayerNormalization`;
    - `MatMulScaleFusion` folds the attention scale 1/sqrt(d_k) into the `FusedMatMul` of Q and K^T, and a
      `FusedMatMul` with a scale other than 1 runs slower than one without plus a `Mul`.
    The unfused operators also compute like PyTorch (residual add, then layer norm; scores, then scale).
    """
    ort = import_onnxruntime()

    if isinstance(disabled_optimizers, str):  # list("SkipLayerNormFusion") would pass onnxruntime's check unnoticed
        raise ValueError(
            f"disabled_optimizers must be a sequence of fusion names, got the string {disabled_optimizers!r}"
        )
    if disabled_optimizers is None:
        disabled_optimizers = CPU_DISABLED_OPTIMIZERS if providers[0] == PROVIDERS["cpu"] else ()
    return ort.InferenceSession(str(path), options, providers=providers, disabled_optimizers=list(disabled_optimizers))


# One buffer per shared-weights file for the whole process, keyed by (path, size, mtime): every OrtTranslator of a
# folder (a server runs several per model) reads the same table.
_SHARED_TABLES: dict[tuple[str, int, int], tuple] = {}


def shared_table(folder: str | os.PathLike, manifest: dict | None):
    """The folder's shared embedding table (manifest `shared_weights`) as an onnxruntime CPU OrtValue, loaded once per
    process, and the initializer names each graph reads it under: `(value, {graph file: [names]})`; `(None, {})`
    for folders without one (int8, fp16 and older exports inline their tables).

    Raises ValueError when the manifest names a file that is missing or not of the shape it records.
    """
    import numpy as np

    from .contract import SHARED_WEIGHTS_KEY

    spec = (manifest or {}).get(SHARED_WEIGHTS_KEY)
    if not spec:
        return None, {}
    path = Path(folder) / spec["file"]
    shape = tuple(spec["shape"])
    if not path.is_file():
        raise ValueError(f"Export folder {folder} has no {spec['file']} (the shared embedding its graphs read)")
    stat = path.stat()
    expected = int(np.prod(shape)) * np.dtype(spec["dtype"]).itemsize
    if stat.st_size != expected:
        raise ValueError(
            f"{path} holds {stat.st_size} bytes; manifest.json records a {spec['dtype']} table of shape {list(shape)} "
            f"({expected} bytes): re-export the folder"
        )
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _SHARED_TABLES:
        table = np.fromfile(path, dtype=spec["dtype"]).reshape(shape)
        # the OrtValue reads the numpy buffer in place: both stay referenced here for the life of the process
        _SHARED_TABLES[key] = (import_onnxruntime().OrtValue.ortvalue_from_numpy(table), table)
    return _SHARED_TABLES[key][0], dict(spec["initializers"])
