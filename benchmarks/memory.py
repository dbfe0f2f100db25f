"""Peak resident memory of each inference path, each in a fresh process.

A child interpreter loads one system from disk, runs the heaviest generation row once (beam 4, batch 16, 24 source
tokens, 32 new tokens) and reports its own peak RSS (VmHWM); the parent repeats that for every path. The ONNX
runtime child imports only onnxruntime, numpy and tokenizers, as a deployment would.

    python -m benchmarks.memory
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks import common

PATHS = [
    "transformers Marian",
    "vanilla PyTorch",
    "vanilla PyTorch, packing off",
    "CTranslate2 fp32",
    "CTranslate2 int8",
    "vanilla ORT fp32",
    "vanilla ORT int8",
]
NUM_BEAMS, BATCH = 4, 16


def child(system: str, workdir: Path, threads: int) -> dict:
    """Runs inside the fresh interpreter: load, generate once, report peak RSS."""
    from benchmarks import generate_speed as gs

    baseline = common.peak_rss_mib()
    start = time.perf_counter()
    folder = {
        "transformers Marian": workdir / "marian",
        "vanilla PyTorch": workdir / "vanilla",
        "vanilla PyTorch, packing off": workdir / "vanilla",
        "CTranslate2 fp32": workdir / "ct2-fp32",
        "CTranslate2 int8": workdir / "ct2-int8",
        "vanilla ORT fp32": workdir / "onnx-fp32",
        "vanilla ORT int8": workdir / "onnx-int8",
    }[system]
    if system == "transformers Marian" or system.startswith("vanilla PyTorch"):
        import torch

        torch.set_num_threads(threads)
        if system == "transformers Marian":
            from transformers import MarianMTModel as model_class
        else:
            from vanilla_transformer import VanillaTransformerForConditionalGeneration as model_class
        model = model_class.from_pretrained(folder).eval()
        if system.endswith("packing off"):  # without the packed decoder weights (config.cpu_weight_packing)
            model.set_cpu_weight_packing(False)
        generate = gs.hf_generate(model)
    elif system.startswith("CTranslate2"):
        generate = gs.ct2_generate(folder, threads)
    else:
        generate = gs.ort_generate(folder, threads)
    load_s = time.perf_counter() - start
    after_load = common.peak_rss_mib()
    generate(gs.source_ids(BATCH), NUM_BEAMS)
    return {
        "system": system,
        "peak_rss_mib": common.peak_rss_mib(),
        "peak_rss_after_load_mib": after_load,
        "interpreter_mib": baseline,
        "load_s": load_s,
        "torch_imported": "torch" in sys.modules,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=common.THREADS)
    parser.add_argument("--workdir", type=Path, default=common.DEFAULT_WORKDIR)
    parser.add_argument("--systems", nargs="*", choices=PATHS, default=None)
    parser.add_argument("--name", default="memory")
    parser.add_argument("--child", choices=PATHS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        print(json.dumps(child(args.child, args.workdir, args.threads)))
        return {}

    paths = common.prepare_artifacts(args.workdir, log=lambda m: print(m, file=sys.stderr))
    systems = args.systems or [s for s in PATHS if "ORT" not in s or paths["onnx-fp32"].exists()]
    results = {}
    for system in systems:
        print(f"  measuring {system} ...", file=sys.stderr, flush=True)
        results[system] = common.run_child(
            ["-m", "benchmarks.memory", "--child", system, "--workdir", str(args.workdir)]
            + ["--threads", str(args.threads)]
        )
    reference = results.get("vanilla PyTorch", {}).get("peak_rss_mib")
    rows = []
    for system, r in results.items():
        share = f"{r['peak_rss_mib'] / reference:.0%}" if reference else "-"
        rows.append(
            [
                system,
                f"{r['peak_rss_mib']:.0f}",
                f"{r['peak_rss_after_load_mib']:.0f}",
                f"{r['load_s']:.1f}",
                "yes" if r["torch_imported"] else "no",
                share,
            ]
        )
    headers = ["inference path", "peak RSS MiB", "after load MiB", "load s", "torch imported", "of vanilla PyTorch"]
    table = common.format_table(headers, rows)
    print(table)
    print(f"\nfresh process per path; beam {NUM_BEAMS}, batch {BATCH}, 24 -> 32 tokens, {args.threads} threads")
    return common.save_results(
        args.name,
        "memory",
        argv,
        machine=common.machine_info(args.threads),
        results=results,
        table=table,
    )


if __name__ == "__main__":
    main()
