"""Shared pieces of the benchmarks: equal-size peers, interleaved timing, statistics, FLOP counting, JSON and tables.

Every peer is built locally with random weights at the paper's base size (d_model 512, 6+6 layers, 8 heads,
d_ff 2048) and a 32,000-token shared vocabulary, so the systems differ only in their code, never in their work.
Heavy imports (torch, transformers, ctranslate2, onnxruntime) happen inside the functions that need them, so that a
child process measuring one inference path loads only that path's libraries.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "benchmarks" / "results"
DEFAULT_WORKDIR = Path(os.environ.get("VT_BENCH_WORKDIR", "/tmp/vanilla-transformer-bench"))

VOCAB_SIZE = 32_000
THREADS = 2
SEED = 0
# Marian's convention: </s> = 0, <unk> = 1, <pad> (also the decoder start) = the last id.
MARIAN_EOS, MARIAN_UNK = 0, 1


@dataclass(frozen=True)
class Dims:
    """The sizes that decide a step's matmul work (paper Table 3, base row, by default)."""

    d_model: int = 512
    d_ff: int = 2048
    encoder_layers: int = 6
    decoder_layers: int = 6
    heads: int = 8
    vocab_size: int = VOCAB_SIZE


BASE = Dims()


# --------------------------------------------------------------------------------------------------------------------
# Statistics


def summarize(times: list[float]) -> dict[str, float]:
    """Median, min, max, mean and the two noise measures we report: the coefficient of variation (stdev / mean) and the
    spread (max - min) / min."""
    if not times:
        raise ValueError("no timings to summarize")
    mean = statistics.fmean(times)
    stdev = statistics.stdev(times) if len(times) > 1 else 0.0
    low, high = min(times), max(times)
    return {
        "n": len(times),
        "median": statistics.median(times),
        "min": low,
        "max": high,
        "mean": mean,
        "cv": stdev / mean if mean > 0 else 0.0,
        "spread": (high - low) / low if low > 0 else 0.0,
    }


def speedup(reference_seconds: float, seconds: float) -> float:
    """How many times faster than the reference (>1 = faster): reference time / time."""
    return reference_seconds / seconds


def run_interleaved(
    systems: dict[str, Callable[[], object]], rounds: int, warmup: int = 1, log: Callable[[str], None] | None = None
) -> dict[str, list[float]]:
    """Time each system once per round, in the order A, B, C, A, B, C, ..., so that slow phases of a busy machine hit
    every system alike. `warmup` untimed rounds come first (allocators, caches, lazy compilation)."""
    times: dict[str, list[float]] = {name: [] for name in systems}
    for round_idx in range(warmup + rounds):
        for name, fn in systems.items():
            start = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - start
            if round_idx >= warmup:
                times[name].append(elapsed)
            if log is not None:
                tag = "warmup" if round_idx < warmup else f"round {round_idx - warmup + 1}/{rounds}"
                log(f"  {tag:>12} {name:<28} {elapsed:8.3f} s")
    return times


# --------------------------------------------------------------------------------------------------------------------
# Machine: threads, load, matmul peak


def generation_arguments(description: str, rounds: int, name: str) -> argparse.ArgumentParser:
    """The command line shared by the generation-speed benchmarks (rows, systems, rounds, threads, work folder)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=rounds, help="timed rounds per system and row")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("--systems", nargs="*", default=None, help="subset of systems (Marian is always run)")
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    parser.add_argument("--name", default=name, help="results file name under benchmarks/results/")
    parser.add_argument("--quiet", action="store_true")
    return parser


def step_arguments(description: str, rounds: int, argv: list[str] | None) -> argparse.Namespace:
    """`--rounds` and `--threads` (the training-step benchmarks's command line), parsed, with the threads pinned."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--threads", type=int, default=THREADS)
    args = parser.parse_args(argv)
    pin_threads(args.threads)
    return args


def pin_threads(threads: int = THREADS) -> None:
    """One thread count for every library (torch here; onnxruntime and CTranslate2 take it per session)."""
    import torch

    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(threads)
    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):  # can only be set once, before any parallel work
        torch.set_num_interop_threads(1)


def machine_info(threads: int = THREADS) -> dict:
    import torch

    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "threads": threads,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "loadavg_1min": os.getloadavg()[0],
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def sgemm_seconds(n: int = 2048, repeats: int = 3) -> float:
    """Seconds per (n x n) @ (n x n) fp32 torch.mm, the best of `repeats` calls."""
    import torch

    gen = torch.Generator().manual_seed(SEED)
    a = torch.randn(n, n, generator=gen)
    b = torch.randn(n, n, generator=gen)
    out = torch.empty(n, n)
    torch.mm(a, b, out=out)  # warm the allocator and the kernel selection
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        best = min(best, time.perf_counter() - start)
    return best


def sgemm_gflops(seconds: float, n: int = 2048) -> float:
    return 2 * n**3 / seconds / 1e9


# --------------------------------------------------------------------------------------------------------------------
# FLOP count of a training step


def forward_matmul_flops(dims: Dims, batch: int, src_len: int, tgt_len: int) -> int:
    """Multiply-add FLOPs (2 per MAC) of one encoder-decoder forward pass with teacher forcing.

    Counts every matmul: the attention projections and FFNs of both stacks, the scores Q Kᵀ and the weighted sum of
    the values (full, unmasked square, as the kernels compute it), the cross-attention keys/values over the source, and
    the output projection to the vocabulary. Element-wise work (softmax, LayerNorm, residuals) is left out.
    """
    d, ff = dims.d_model, dims.d_ff
    linear = 2 * d * d  # one (d_model x d_model) projection, per token
    encoder_token = dims.encoder_layers * (4 * linear + 2 * 2 * d * ff + 2 * 2 * src_len * d)
    cross_kv_source_token = dims.decoder_layers * 2 * linear
    decoder_token = dims.decoder_layers * (
        4 * linear  # self-attention q, k, v, out
        + 2 * linear  # cross-attention q, out
        + 2 * 2 * d * ff  # FFN
        + 2 * 2 * tgt_len * d  # self-attention scores and weighted sum
        + 2 * 2 * src_len * d  # cross-attention scores and weighted sum
    )
    output_projection = 2 * d * dims.vocab_size
    return batch * (src_len * (encoder_token + cross_kv_source_token) + tgt_len * (decoder_token + output_projection))


def training_step_flops(dims: Dims, batch: int, src_len: int, tgt_len: int) -> int:
    """Forward + backward: the backward pass costs two forward passes (gradients of inputs and of weights)."""
    return 3 * forward_matmul_flops(dims, batch, src_len, tgt_len)


def generation_matmul_flops(dims: Dims, batch: int, num_beams: int, src_len: int, new_tokens: int) -> int:
    """Multiply-add FLOPs of a cached generation that runs exactly `new_tokens` decoder steps: the least matmul work
    any implementation of the same search does.

    The encoder and the cross-attention keys/values run once per source sentence (not once per beam). Every step runs
    the decoder on `batch * num_beams` rows of one new token each: the six projections, the FFN, the self-attention
    over the cache plus the new token, the cross-attention over the source and the output projection to the vocabulary
    (every row needs all its log-probabilities: beam search ranks them all). Element-wise work is left out.
    """
    d, ff = dims.d_model, dims.d_ff
    linear = 2 * d * d
    encoder_token = dims.encoder_layers * (4 * linear + 2 * 2 * d * ff + 2 * 2 * src_len * d)
    cross_kv_source_token = dims.decoder_layers * 2 * linear
    step_row = dims.decoder_layers * (4 * linear + 2 * linear + 2 * 2 * d * ff + 2 * 2 * src_len * d)
    step_row += 2 * d * dims.vocab_size
    attended = sum(range(1, new_tokens + 1))  # step t attends over t positions (t - 1 cached, 1 new)
    self_attention = dims.decoder_layers * 2 * 2 * d * attended
    rows = batch * num_beams
    return batch * src_len * (encoder_token + cross_kv_source_token) + rows * (new_tokens * step_row + self_attention)


# --------------------------------------------------------------------------------------------------------------------
# The peers, built locally with random weights


def config_dims(dims: Dims) -> dict[str, int]:
    """`dims` as the config fields that this package and transformers' Marian (both BART-style) share."""
    return {
        "vocab_size": dims.vocab_size,
        "d_model": dims.d_model,
        "encoder_layers": dims.encoder_layers,
        "decoder_layers": dims.decoder_layers,
        "encoder_attention_heads": dims.heads,
        "decoder_attention_heads": dims.heads,
        "encoder_ffn_dim": dims.d_ff,
        "decoder_ffn_dim": dims.d_ff,
    }


def vanilla_config(dims: Dims = BASE):
    from vanilla_transformer import VanillaTransformerConfig

    return VanillaTransformerConfig.from_preset("base", **config_dims(dims))


def build_vanilla(dims: Dims = BASE, seed: int = SEED):
    import torch

    from vanilla_transformer import VanillaTransformerForConditionalGeneration

    torch.manual_seed(seed)
    return VanillaTransformerForConditionalGeneration(vanilla_config(dims))


def marian_config(dims: Dims = BASE, activation_function: str = "relu"):
    """transformers' Marian with our dimensions: ReLU (OPUS-MT checkpoints use swish), one shared embedding,
    √d_model scaling, dropout 0.1 on the sub-layer outputs only (as the paper and our base preset); the decoder
    starts from the pad token, the last id."""
    from transformers import MarianConfig

    return MarianConfig(
        **config_dims(dims),
        decoder_vocab_size=dims.vocab_size,
        activation_function=activation_function,
        share_encoder_decoder_embeddings=True,
        scale_embedding=True,
        max_position_embeddings=512,
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=dims.vocab_size - 1,
        eos_token_id=MARIAN_EOS,
        decoder_start_token_id=dims.vocab_size - 1,
        forced_eos_token_id=None,
    )


def build_marian(dims: Dims = BASE, seed: int = SEED):
    import torch
    from transformers import MarianMTModel

    torch.manual_seed(seed)
    return MarianMTModel(marian_config(dims))


def marian_vocabulary(vocab_size: int = VOCAB_SIZE) -> list[str]:
    """Token strings by id: </s>, <unk>, then placeholder words, with <pad> last (Marian's layout)."""
    tokens = [f"w{i}" for i in range(vocab_size)]
    tokens[MARIAN_EOS], tokens[MARIAN_UNK], tokens[vocab_size - 1] = "</s>", "<unk>", "<pad>"
    return tokens


def vanilla_vocabulary(vocab_size: int = VOCAB_SIZE) -> list[str]:
    """Token strings by id in this package's layout: <pad> = 0, <s> = 1, </s> = 2, <unk> = 3."""
    return ["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(4, vocab_size)]


def build_word_tokenizer(tokens: list[str]):
    """A whitespace word-level tokenizer over `tokens`: CTranslate2's converter and the ONNX export folder read the
    vocabulary from it (the benchmarks feed token ids, so its only job is to be there)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(WordLevel({tok: i for i, tok in enumerate(tokens)}, unk_token="<unk>"))
    backend.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", unk_token="<unk>", pad_token="<pad>")


def timed(fn: Callable[[], object]) -> tuple[object, float]:
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def prepare_artifacts(workdir: Path = DEFAULT_WORKDIR, with_onnx: bool = True, log=print) -> dict[str, Path]:
    """Save the random-weight models once (idempotent) and return their folders, plus how long each conversion took
    when it was done in this call (in `workdir / "export_times.json"`)."""
    workdir.mkdir(parents=True, exist_ok=True)
    paths = {
        "marian": workdir / "marian",
        "vanilla": workdir / "vanilla",
        "ct2-fp32": workdir / "ct2-fp32",
        "ct2-int8": workdir / "ct2-int8",
        "onnx-fp32": workdir / "onnx-fp32",
        "onnx-int8": workdir / "onnx-int8",
    }
    times_file = workdir / "export_times.json"
    times = json.loads(times_file.read_text()) if times_file.exists() else {}
    if not (paths["marian"] / "config.json").exists():
        log(f"saving Marian to {paths['marian']}")
        build_marian().save_pretrained(paths["marian"])
        build_word_tokenizer(marian_vocabulary()).save_pretrained(paths["marian"])
    if not (paths["vanilla"] / "config.json").exists():
        log(f"saving vanilla-transformer to {paths['vanilla']}")
        build_vanilla().save_pretrained(paths["vanilla"])
    if not (paths["vanilla"] / "tokenizer.json").exists():
        build_word_tokenizer(vanilla_vocabulary()).save_pretrained(paths["vanilla"])
    for quantization in ("fp32", "int8"):
        out = paths[f"ct2-{quantization}"]
        if not (out / "model.bin").exists():
            log(f"converting Marian with CTranslate2 ({quantization}) to {out}")
            _, times[f"ct2-{quantization}"] = timed(lambda q=quantization, o=out: convert_ct2(paths["marian"], o, q))
    if with_onnx and onnx_available():
        for quantization in ("fp32", "int8"):
            out = paths[f"onnx-{quantization}"]
            if not _current_export(out, quantization):
                log(f"exporting vanilla-transformer to ONNX ({quantization}) in {out}")
                _, times[f"onnx-{quantization}"] = timed(
                    lambda q=quantization, o=out: export_onnx(paths["vanilla"], o, q)
                )
            else:  # the weightless ranking graph as this exporter writes it (a cached folder may predate it)
                from vanilla_transformer.export.onnx_helper_graphs import write_beam_scores_graph

                write_beam_scores_graph(out)
    times_file.write_text(json.dumps(times, indent=2))
    return paths


def _current_export(folder: Path, variant: str) -> bool:
    """An export folder written completely (the manifest comes last) as the exporter writes it now: the current
    format version, for fp32 the embedding stored once, and for int8 activations quantized per row."""
    from vanilla_transformer_ort.contract import MANIFEST_FILE, MANIFEST_FORMAT_VERSION, SHARED_WEIGHTS_KEY

    path = folder / MANIFEST_FILE
    if not path.exists():
        return False
    manifest = json.loads(path.read_text())
    quantization = "int8-dynamic-per-row" if variant == "int8" else None
    if variant == "fp32" and SHARED_WEIGHTS_KEY not in manifest:
        return False
    return manifest.get("format_version") == MANIFEST_FORMAT_VERSION and manifest.get("quantization") == quantization


def convert_ct2(marian_dir: Path, output_dir: Path, quantization: str) -> None:
    from ctranslate2.converters import TransformersConverter

    converter = TransformersConverter(str(marian_dir))
    converter.convert(str(output_dir), quantization=None if quantization == "fp32" else quantization, force=True)


def vanilla_ct2(model_dir: Path, quantization: str) -> Path:
    """This package's own CTranslate2 export of `model_dir`, made once next to it: `<model_dir>-ct2-<quantization>`."""
    from vanilla_transformer.export.ctranslate2_export import export_ctranslate2

    output = model_dir.parent / f"{model_dir.name}-ct2-{quantization}"
    if not (output / "model.bin").exists():
        weights = None if quantization == "fp32" else quantization
        export_ctranslate2(model_dir, output, quantization=weights, force=True)
    return output


def onnx_available() -> bool:
    """True once this branch has the ONNX export and the onnxruntime translator."""
    try:
        import vanilla_transformer_ort  # noqa: F401
        from vanilla_transformer.export import onnx_export  # noqa: F401
    except ImportError:
        return False
    return True


def export_onnx(model_dir: Path, output_dir: Path, quantization: str) -> None:
    from vanilla_transformer.export.onnx_export import export_model

    export_model(model_dir, output_dir, quantize=None if quantization == "fp32" else quantization)


def int8_per_tensor_export(paths: dict[str, Path]) -> Path:
    """The int8 export with one activation range per tensor (`int8_activations="tensor"`), beside the others; made
    once, for the A/B of per-row activation quantization."""
    from vanilla_transformer.export.onnx_export import export_model
    from vanilla_transformer_ort.contract import MANIFEST_FILE

    folder = paths["onnx-int8"].parent / "onnx-int8-tensor"
    if not (folder / MANIFEST_FILE).exists():
        export_model(paths["vanilla"], folder, quantize="int8", int8_activations="tensor")
    return folder


def int8_offset_rows_export(paths: dict[str, Path]) -> Path:
    """The int8 export with the previous per-row formulation (benchmarks/int8_offset_rows.py), beside the others;
    made once from the per-tensor export, for the A/B of the current per-row quantization."""
    from benchmarks.int8_offset_rows import offset_rows_export

    return offset_rows_export(int8_per_tensor_export(paths), paths["onnx-int8"].parent / "onnx-int8-offset-rows")


# --------------------------------------------------------------------------------------------------------------------
# Peak memory of a fresh process


def peak_rss_mib() -> float:
    """This process's peak resident set size in MiB: VmHWM of /proc/self/status.

    Not `ru_maxrss`: Linux carries it across exec, so a child started from a big parent would report at least the
    parent's size at fork time."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_child(args: list[str], timeout: float = 1800) -> dict:
    """Run `python -m benchmarks.<args>` in a fresh interpreter; its last stdout line is a JSON object."""
    result = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"child {args} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------------------------------
# Output


def format_table(headers: list[str], rows: list[list[object]]) -> str:
    """A GitHub-flavoured markdown table."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells]
    return "\n".join([line, rule, *body])


def write_json(name: str, payload: dict, results_dir: Path = RESULTS_DIR) -> Path:
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
    return path


def command_line(benchmark: str, argv: list[str] | None) -> str:
    """The command that reproduces this run, as recorded in its results file."""
    return f"python -m benchmarks.{benchmark} " + " ".join(argv if argv is not None else sys.argv[1:])


def save_results(name: str, benchmark: str, argv: list[str] | None, **fields) -> dict:
    """Write `benchmarks/results/<name>.json` (which benchmark, the command that reproduces it, then `fields`), say
    where, and return what was written (the end of every benchmark)."""
    payload = {"benchmark": benchmark, "command": command_line(benchmark, argv), **fields}
    path = write_json(name, payload)
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return payload


def save_step_results(benchmark: str, argv: list[str] | None, args, results: dict[str, dict[str, float]]) -> dict:
    """Print the noise line and write `results/<benchmark>.json` with the machine, the settings and every summary
    (the end of the training-step benchmarks)."""
    noise = noise_line(results)
    print(noise)
    return save_results(
        benchmark, benchmark, argv, machine=machine_info(args.threads), settings=vars(args), results=results,
        noise=noise,
    )  # fmt: skip


def noise_line(stats: dict[str, dict[str, float]]) -> str:
    """One sentence on how noisy the machine was: the median and worst coefficient of variation over all systems."""
    cvs = sorted(s["cv"] for s in stats.values())
    spreads = sorted(s["spread"] for s in stats.values())
    return (
        f"noise: coefficient of variation median {statistics.median(cvs):.1%}, worst {cvs[-1]:.1%}; "
        f"(max-min)/min worst {spreads[-1]:.1%}; load average now {os.getloadavg()[0]:.2f}"
    )
