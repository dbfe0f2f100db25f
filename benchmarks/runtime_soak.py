"""Soak test of the torch-free runtime: 10,000 `OrtTranslator.translate` calls in one process, resident set growth.

    python -m benchmarks.runtime_soak                          # a tiny random model, exported to a temporary folder
    python -m benchmarks.runtime_soak --model onnx/base-int8 --calls 2000

Calls mix batch sizes (1-16), source lengths (1-40 words), output lengths (2-24 new tokens) and beams (1, 2, 4),
drawn from a fixed seed. The warm-up (`--warmup` calls) first meets every batch size and beam count at the longest
lengths, so allocators have seen the largest shapes. The resident set size (VmRSS) is read at its end and then every
250 calls, each time after `gc.collect()` and glibc's `malloc_trim(0)`: without the trim a reading swings by 15%
with the size of the calls just before it (freed memory the allocator keeps), which would hide a leak or fake one.
The figure is the growth from the median of the first five readings after warm-up to the median of the last five
(target: under 5%). Without `--model`, a tiny random model (the "tiny" preset, vocabulary 1000) is built and
exported by a child process, so this process never imports torch, as in serving. Results go to
`benchmarks/results/runtime_soak.json`. Not a timed test.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import common
from vanilla_transformer_ort import OrtTranslator

TARGET_GROWTH = 0.05
BATCHES, BEAMS = (1, 2, 4, 8, 16), (1, 2, 4)
MAX_WORDS, MAX_NEW_TOKENS = 40, 24
VOCAB_SIZE = 1000


def rss_mib() -> float:
    """Current resident set size (VmRSS) of this process in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def settled_rss_mib() -> float:
    """RSS after a garbage collection and after glibc has returned its free memory to the system."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: the reading includes the allocator's free memory
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_mib()


def prepare(folder: Path) -> None:
    """A tiny random model with a word-level tokenizer, exported (fp32) to `folder` (runs in a child process)."""
    from benchmarks.onnx_speed import random_model
    from vanilla_transformer.export.onnx_export import export_model

    model_dir = folder.parent / "model"
    random_model(model_dir, VOCAB_SIZE, preset="tiny")
    export_model(model_dir, folder)


def sentences(rng: np.random.Generator, batch: int, words: int | None = None) -> list[str]:
    lengths = [words] * batch if words else rng.integers(1, MAX_WORDS + 1, batch)
    return [" ".join(f"w{i}" for i in rng.integers(4, VOCAB_SIZE, length)) for length in lengths]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, help="export folder (default: build a tiny random one)")
    parser.add_argument("--calls", type=int, default=10_000)
    parser.add_argument("--warmup", type=int, default=200, help="calls before the baseline reading")
    parser.add_argument("--threads", type=int, default=common.THREADS)
    parser.add_argument("--seed", type=int, default=common.SEED)
    parser.add_argument("--name", default="runtime_soak", help="results file name")
    parser.add_argument("--prepare", type=Path, help=argparse.SUPPRESS)  # internal: the child that builds a model
    args = parser.parse_args(argv)
    if args.prepare:
        prepare(args.prepare)
        return {}
    if args.calls <= args.warmup or args.warmup < len(BATCHES) * len(BEAMS):
        parser.error(f"need --calls > --warmup >= {len(BATCHES) * len(BEAMS)}")

    folder = args.model
    if folder is None:
        folder = Path(tempfile.mkdtemp(prefix="vt-soak-")) / "onnx"
        print(f"building a tiny random model in {folder.parent} ...", flush=True)
        subprocess.run([sys.executable, "-m", "benchmarks.runtime_soak", "--prepare", str(folder)], check=True,
                       cwd=common.ROOT)  # fmt: skip
    translator = OrtTranslator(folder, provider="cpu", intra_op_num_threads=args.threads)
    rng = np.random.default_rng(args.seed)
    # Warm-up first meets every (batch, beams) pair at the longest source and output, then random calls.
    largest = [(batch, beams) for batch in BATCHES for beams in BEAMS]
    started = time.perf_counter()
    samples: list[tuple[int, float]] = []
    for call in range(1, args.calls + 1):
        if call <= len(largest):
            batch, beams = largest[call - 1]
            texts, new_tokens = sentences(rng, batch, MAX_WORDS), MAX_NEW_TOKENS
        else:
            batch, beams = int(rng.choice(BATCHES)), int(rng.choice(BEAMS))
            texts, new_tokens = sentences(rng, batch), int(rng.integers(2, MAX_NEW_TOKENS + 1))
        outputs = translator.translate(texts, num_beams=beams, max_new_tokens=new_tokens)
        assert len(outputs) == batch
        if call == args.warmup or (call > args.warmup and (call % 250 == 0 or call == args.calls)):
            samples.append((call, settled_rss_mib()))
            print(f"after {call:6d} calls: RSS {samples[-1][1]:8.1f} MiB", flush=True)
    seconds = time.perf_counter() - started
    after = [rss for call, rss in samples if call > args.warmup]
    start, end = statistics.median(after[:5]), statistics.median(after[-5:])
    growth = end / start - 1
    print(
        f"{args.calls} calls in {seconds:.0f} s; RSS (median of 5 readings) {start:.1f} MiB after warm-up, "
        f"{end:.1f} MiB at the end: {growth:+.2%} (target < {TARGET_GROWTH:.0%}); all readings after warm-up "
        f"{min(after):.1f}-{max(after):.1f} MiB"
    )
    return common.save_results(
        args.name,
        "runtime_soak",
        argv,
        machine=common.machine_info(args.threads),
        settings={"calls": args.calls, "warmup": args.warmup, "batches": BATCHES, "beams": BEAMS,
                  "max_words": MAX_WORDS, "max_new_tokens": MAX_NEW_TOKENS, "seed": args.seed,
                  "model": str(args.model) if args.model else f"random tiny preset, vocabulary {VOCAB_SIZE}"},
        seconds=seconds,
        rss_mib={"after_warmup": start, "final": end, "samples": samples},
        growth=growth,
        target_growth=TARGET_GROWTH,
    )  # fmt: skip


if __name__ == "__main__":
    main()
