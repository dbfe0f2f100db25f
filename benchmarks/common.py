"""Shared pieces of the benchmarks: command line, results file, interleaved timing, statistics, FLOP counts and the
random-weight peers. Heavy imports stay inside functions: a child process measuring one path loads only its own."""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "benchmarks" / "results"
DEFAULT_WORKDIR = Path(os.environ.get("VT_BENCH_WORKDIR", "/tmp/vanilla-transformer-bench"))
VOCAB_SIZE, THREADS, SEED = 32_000, 2, 0
MARIAN_EOS, MARIAN_UNK = 0, 1  # Marian's convention; <pad> (also the decoder start) is the last id


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
OPUS_MT = Dims(vocab_size=58_101)  # an OPUS-MT en-de checkpoint's shape (with swish and a logit bias)


def parser(doc: str, output: str | None, rounds: int | None = None) -> argparse.ArgumentParser:
    """The flags every benchmark shares: `--threads`, `--output` and, for timed ones, `--rounds`."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if rounds is not None:
        parser.add_argument("--rounds", type=int, default=rounds, help="timed rounds per system")
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("--output", default=output, help="results file: NAME (benchmarks/results/NAME.json) or a path")
    return parser


def save_results(output: str | Path, benchmark: str, argv: list[str] | None, *, machine: dict, settings: dict,
                 results: dict, same_run: Sequence[str] | None = None) -> dict:  # fmt: skip
    """Write {"benchmark", "command", "machine", "settings", "results"} to `output` (a name under benchmarks/results/
    or a path) and return it; with `same_run`, {"runs": [...]}, this run replacing the one that agrees on those."""
    path = Path(output).with_suffix(".json") if "/" in str(output) else RESULTS_DIR / f"{output}.json"
    command = f"python -m benchmarks.{benchmark} " + " ".join(sys.argv[1:] if argv is None else argv)
    run = json.loads(json.dumps({"benchmark": benchmark, "command": command.strip(), "machine": machine,
                                 "settings": settings, "results": results}, default=str))  # fmt: skip
    written = run
    if same_run is not None:  # the earlier run of these settings goes, this one comes last
        key = [run["settings"].get(name) for name in same_run]
        runs = json.loads(path.read_text())["runs"] if path.exists() else []
        written = {"runs": [old for old in runs if [old["settings"].get(name) for name in same_run] != key] + [run]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(written, indent=2) + "\n")
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return run


def format_table(headers: list[str], rows: list[list[object]]) -> str:
    """A GitHub-flavoured markdown table."""
    cells = [[str(c) for c in row] for row in [headers, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |" for row in cells]
    return "\n".join([lines[0], "|" + "|".join("-" * (w + 2) for w in widths) + "|", *lines[1:]])


def read_tsv(path: Path, limit: int | None = None) -> tuple[list[str], list[str]]:
    """Sources and references (columns 1 and 2) of a TSV with a header line."""
    rows = [line.split("\t") + [""] for line in path.read_text(encoding="utf-8").splitlines()[1:] if line.strip()]
    return [row[0] for row in rows[:limit]], [row[1] for row in rows[:limit]]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def summarize(times: list[float]) -> dict[str, float]:
    """Median, min, max, mean and the noise: coefficient of variation (stdev / mean), spread (max - min) / min."""
    mean, low, high = statistics.fmean(times), min(times), max(times)  # no timings: fmean raises a ValueError
    stdev = statistics.stdev(times) if len(times) > 1 else 0.0
    return {"n": len(times), "median": statistics.median(times), "min": low, "max": high, "mean": mean,
            "cv": stdev / mean if mean > 0 else 0.0, "spread": (high - low) / low if low > 0 else 0.0}  # fmt: skip


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
                log(f"  round {round_idx + 1 - warmup:>2}/{rounds} {name:<28} {elapsed:8.3f} s")  # rounds < 1: warm-up
    return times


def noise_line(stats: dict[str, dict[str, float]]) -> str:
    """One sentence on how noisy the machine was: the median and worst coefficient of variation over all systems."""
    cvs, spreads = sorted(s["cv"] for s in stats.values()), sorted(s["spread"] for s in stats.values())
    return (
        f"noise: coefficient of variation median {statistics.median(cvs):.1%}, worst {cvs[-1]:.1%}; "
        f"(max-min)/min worst {spreads[-1]:.1%}; load average now {os.getloadavg()[0]:.2f}"
    )


def pin_threads(threads: int = THREADS) -> None:
    """One thread count for every library (torch here; onnxruntime and CTranslate2 take it per session)."""
    import torch

    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):  # can only be set once, before any parallel work
        torch.set_num_interop_threads(1)


def machine_info(threads: int = THREADS) -> dict:
    """The CPU, threads, Python and torch versions (torch's from its metadata, not imported), load and date."""
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")]
    return {"cpu": names[0] if names else "unknown", "logical_cpus": os.cpu_count(), "threads": threads,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"), "python": platform.python_version(),
            "torch": next((d.version for d in importlib.metadata.distributions(name="torch")), None),
            "loadavg_1min": os.getloadavg()[0],
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip


def sgemm_systems(threads: int, workdir: Path | None = None, n: int = 2048) -> dict[str, Callable[[], object]]:
    """(n x n) @ (n x n) in fp32 by torch.mm and, given a `workdir`, onnxruntime's MatMul on a constant (prepacked)
    right-hand side: timed among the systems, the fastest is this machine's fp32 matmul peak (`sgemm_gflops`)."""
    import torch

    a, b, out = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
    systems = {"sgemm torch": lambda: torch.mm(a, b, out=out)}
    if workdir is not None:
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper

        from vanilla_transformer_ort.sessions import session_options

        path = workdir / f"sgemm{n}.onnx"
        if not path.is_file():
            a_info, c_info = (helper.make_tensor_value_info(name, TensorProto.FLOAT, [n, n]) for name in "ac")
            node = helper.make_node("MatMul", ["a", "b"], ["c"])
            graph = helper.make_graph([node], "sgemm", [a_info], [c_info], [numpy_helper.from_array(b.numpy(), "b")])
            onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), path)
        session = ort.InferenceSession(str(path), session_options(threads), providers=["CPUExecutionProvider"])
        feed = {"a": a.numpy()}
        systems["sgemm onnxruntime"] = lambda: session.run(None, feed)
    return systems


def sgemm_gflops(seconds: float, n: int = 2048) -> float:
    return 2 * n**3 / seconds / 1e9


def peak_rss_mib() -> float:
    """This process's peak resident set size in MiB: VmHWM of /proc/self/status (not `ru_maxrss`: Linux carries it
    across exec, so a child started from a big parent would report at least the parent's size at fork time)."""
    return next(int(line.split()[1]) / 1024 for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("VmHWM:"))  # fmt: skip


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    tree = [pid]
    for current in tree:  # the list grows as it is walked: every process comes after its parent
        tree.extend(children.get(current, []))
    return tree


def run_child(command: list[str], timeout: float = 1800) -> dict:
    """Run `command` from the repository root (a fresh interpreter, or another one); its last stdout line is JSON."""
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"child {command} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def source_token_flops(dims: Dims, src_len: int) -> int:
    """Matmul FLOPs (2 per multiply-add) of one source token: its encoder layers and its cross-attention K/V."""
    d, linear = dims.d_model, 2 * dims.d_model**2  # one (d_model x d_model) projection, per token
    encoder = dims.encoder_layers * (4 * linear + 2 * 2 * d * dims.d_ff + 2 * 2 * src_len * d)
    return encoder + dims.decoder_layers * 2 * linear


def forward_matmul_flops(dims: Dims, batch: int, src_len: int, tgt_len: int) -> int:
    """Multiply-add FLOPs (2 per MAC) of one forward pass with teacher forcing: every matmul (projections, FFNs, the
    full square of attention scores and weighted sums, cross-attention K/V over the source, the output projection);
    element-wise work (softmax, LayerNorm, residuals) is left out."""
    d, linear = dims.d_model, 2 * dims.d_model**2
    # self-attention q, k, v, out and cross-attention q, out; FFN; self- and cross-attention scores and weighted sums
    decoder_token = dims.decoder_layers * (6 * linear + 2 * 2 * d * dims.d_ff + 2 * 2 * (tgt_len + src_len) * d)
    return batch * (src_len * source_token_flops(dims, src_len) + tgt_len * (decoder_token + 2 * d * dims.vocab_size))


def training_step_flops(dims: Dims, batch: int, src_len: int, tgt_len: int) -> int:
    """Forward + backward: the backward pass costs two forward passes (gradients of inputs and of weights)."""
    return 3 * forward_matmul_flops(dims, batch, src_len, tgt_len)


def generation_matmul_flops(dims: Dims, batch: int, num_beams: int, src_len: int, new_tokens: int) -> int:
    """Multiply-add FLOPs of a cached generation of exactly `new_tokens` steps, the least matmul work any search does:
    the encoder and cross-attention K/V once per source, then per step `batch * num_beams` rows of one token through
    the decoder and the whole output projection (beam search ranks every log-probability)."""
    d, linear = dims.d_model, 2 * dims.d_model**2
    step_row = dims.decoder_layers * (6 * linear + 4 * d * dims.d_ff + 4 * src_len * d) + 2 * d * dims.vocab_size
    attended = sum(range(1, new_tokens + 1))  # step t attends over t positions (t - 1 cached, 1 new)
    self_attention = dims.decoder_layers * 2 * 2 * d * attended
    return batch * (src_len * source_token_flops(dims, src_len) + num_beams * (new_tokens * step_row + self_attention))


def config_dims(dims: Dims) -> dict[str, int]:
    """`dims` as the config fields that this package and transformers' Marian (both BART-style) share."""
    sizes = {"vocab_size": dims.vocab_size, "d_model": dims.d_model}
    for side in ("encoder", "decoder"):
        sizes |= {f"{side}_layers": getattr(dims, f"{side}_layers"), f"{side}_attention_heads": dims.heads,
                  f"{side}_ffn_dim": dims.d_ff}  # fmt: skip
    return sizes


def build_vanilla(dims: Dims = BASE, preset: str = "base"):
    import torch

    from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

    torch.manual_seed(SEED)
    overrides = config_dims(dims) if preset == "base" else {"vocab_size": dims.vocab_size}
    return VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.from_preset(preset, **overrides))


def build_marian(dims: Dims = BASE):
    """transformers' Marian at `dims`, as the paper and our base preset (dropout on sub-layer outputs only); at
    OPUS-MT's shape swish and a random non-zero logit bias, as trained OPUS-MT checkpoints hold."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(SEED)
    config = MarianConfig(
        **config_dims(dims), decoder_vocab_size=dims.vocab_size, activation_function="swish" if dims == OPUS_MT else
        "relu", share_encoder_decoder_embeddings=True, scale_embedding=True, max_position_embeddings=512, dropout=0.1,
        attention_dropout=0.0, activation_dropout=0.0, pad_token_id=dims.vocab_size - 1, eos_token_id=MARIAN_EOS,
        decoder_start_token_id=dims.vocab_size - 1, forced_eos_token_id=None,
    )  # fmt: skip
    model = MarianMTModel(config)
    if dims == OPUS_MT:
        with torch.no_grad():
            model.final_logits_bias.normal_(0.0, 1.0)
    return model


def marian_vocabulary(vocab_size: int = VOCAB_SIZE) -> list[str]:
    """Token strings by id: </s>, <unk>, then placeholder words, with <pad> last (Marian's layout)."""
    tokens = [f"w{i}" for i in range(vocab_size)]
    tokens[MARIAN_EOS], tokens[MARIAN_UNK], tokens[vocab_size - 1] = "</s>", "<unk>", "<pad>"
    return tokens


def vanilla_vocabulary(vocab_size: int = VOCAB_SIZE) -> list[str]:
    """Token strings by id in this package's layout: <pad> = 0, <s> = 1, </s> = 2, <unk> = 3."""
    return ["<pad>", "<s>", "</s>", "<unk>"] + [f"w{i}" for i in range(4, vocab_size)]


def save_with_tokenizer(model, folder: Path, tokens: list[str]) -> None:
    """`model` saved with a whitespace word-level tokenizer over `tokens`: CTranslate2's converter and the ONNX export
    read the vocabulary from it (the benchmarks feed token ids, so its only job is to be there)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(WordLevel({tok: i for i, tok in enumerate(tokens)}, unk_token="<unk>"))
    backend.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def prepare_artifacts(workdir: Path = DEFAULT_WORKDIR, dims: Dims = BASE, with_onnx: bool = True) -> dict[str, Path]:
    """Save the random-weight peers and convert them once (idempotent); return their folders. At OPUS-MT's shape this
    package's model is Marian's weights imported by `vanilla_transformer.marian.from_marian` (with Marian's vocab)."""
    prefix = "opus-" if dims == OPUS_MT else ""
    names = ("marian", "vanilla", "ct2-fp32", "ct2-int8", "onnx-fp32", "onnx-int8")
    paths = {name: workdir / f"{prefix}{name}" for name in names}
    if not (paths["marian"] / "config.json").exists():
        log(f"saving Marian to {paths['marian']}")
        save_with_tokenizer(build_marian(dims), paths["marian"], marian_vocabulary(dims.vocab_size))
    if not (paths["vanilla"] / "config.json").exists() and prefix:
        from transformers import MarianMTModel

        from vanilla_transformer.marian import from_marian

        vocab = marian_vocabulary(dims.vocab_size)
        save_with_tokenizer(from_marian(MarianMTModel.from_pretrained(paths["marian"])), paths["vanilla"], vocab)
        (paths["vanilla"] / "vocab.json").write_text(json.dumps({token: i for i, token in enumerate(vocab)}))
    elif not (paths["vanilla"] / "config.json").exists():
        log(f"saving vanilla-transformer to {paths['vanilla']}")
        save_with_tokenizer(build_vanilla(dims), paths["vanilla"], vanilla_vocabulary(dims.vocab_size))
    for quantization in ("fp32", "int8"):
        if not (paths[f"ct2-{quantization}"] / "model.bin").exists():
            log(f"converting Marian with CTranslate2 ({quantization})")
            convert_ct2(paths["marian"], paths[f"ct2-{quantization}"], quantization)
        if with_onnx and not current_export(paths[f"onnx-{quantization}"], quantization):
            log(f"exporting vanilla-transformer to ONNX ({quantization})")
            export_onnx(paths["vanilla"], paths[f"onnx-{quantization}"], quantization)
    return paths


def current_export(folder: Path, quantization: str) -> bool:
    """An export folder written completely (manifest last) in the exporter's current format and quantization."""
    from vanilla_transformer_ort.contract import MANIFEST_FILE, MANIFEST_FORMAT_VERSION

    manifest = json.loads((folder / MANIFEST_FILE).read_text()) if (folder / MANIFEST_FILE).exists() else {}
    quantized = "int8-dynamic-per-row" if quantization == "int8" else None
    return manifest.get("format_version") == MANIFEST_FORMAT_VERSION and manifest.get("quantization", 0) == quantized


def convert_ct2(marian_dir: Path, output_dir: Path, quantization: str) -> None:
    from ctranslate2.converters import TransformersConverter

    weights = None if quantization == "fp32" else quantization
    TransformersConverter(str(marian_dir)).convert(str(output_dir), quantization=weights, force=True)


def ct2_translate(folder: Path, threads: int) -> Callable[[list[str], dict], list[str]]:
    """`translate(texts, options)` by CTranslate2 on this package's export folder: its tokenizer.json's tokens in, the
    best hypotheses detokenized without special tokens; `options` as `generate()` takes them (`num_beams`, ...)."""
    import ctranslate2
    from tokenizers import Tokenizer

    from vanilla_transformer.export.ctranslate2_export import generation_options

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    translator = ctranslate2.Translator(str(folder), device="cpu", intra_threads=threads, inter_threads=1)

    def translate(texts: list[str], options: dict) -> list[str]:
        source = [encoding.tokens for encoding in tokenizer.encode_batch(texts)]
        output = translator.translate_batch(source, **generation_options(**options))
        ids = [[tokenizer.token_to_id(token) for token in result.hypotheses[0]] for result in output]
        return [tokenizer.decode([i for i in row if i is not None], skip_special_tokens=True) for row in ids]

    return translate


def vanilla_ct2(model_dir: Path, quantization: str) -> Path:
    """This package's own CTranslate2 export of `model_dir`, made once next to it: `<model_dir>-ct2-<quantization>`."""
    from vanilla_transformer.export.ctranslate2_export import export_ctranslate2

    output = model_dir.parent / f"{model_dir.name}-ct2-{quantization}"
    if not (output / "model.bin").exists():
        export_ctranslate2(
            model_dir, output, quantization=None if quantization == "fp32" else quantization, force=True
        )
    return output


def export_onnx(model_dir: Path, output_dir: Path, quantization: str = "fp32", **options) -> None:
    from vanilla_transformer.export.onnx.export import export_model

    export_model(model_dir, output_dir, quantize=None if quantization == "fp32" else quantization, **options)
