"""Each inference path's peak resident memory (load, beam 4 at batch 16) or, with `--exports`, each export's time, one
fresh process each; docs/benchmarks.md, runs in docs/experiments/speed-log.md."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common

FOLDERS = {  # inference path -> its folder under the work folder
    "transformers Marian": "marian",
    "vanilla PyTorch": "vanilla",
    "vanilla PyTorch, packing off": "vanilla",
    "CTranslate2 fp32": "ct2-fp32",
    "CTranslate2 int8": "ct2-int8",
    "vanilla ORT fp32": "onnx-fp32",
    "vanilla ORT int8": "onnx-int8",
}
EXPORTS = [f"{exporter} {quantization} export" for exporter in ("CTranslate2", "vanilla ONNX") for quantization in
           ("fp32", "int8")]  # fmt: skip


def memory_child(system: str, folder: Path, threads: int) -> dict:
    """Load, generate once, report peak RSS."""
    from benchmarks import generate_speed as gs

    baseline, start = common.peak_rss_mib(), time.perf_counter()
    if system.startswith("CTranslate2"):
        generate = gs.ct2_generate(folder, threads, common.marian_vocabulary())
    elif "ORT" in system:
        generate = gs.ort_generate(folder, threads)
    else:
        import torch
        from transformers import MarianMTModel

        from vanilla_transformer import VanillaTransformerForConditionalGeneration

        torch.set_num_threads(threads)
        model_class = MarianMTModel if system == "transformers Marian" else VanillaTransformerForConditionalGeneration
        model = model_class.from_pretrained(folder).eval()
        if system.endswith("packing off"):
            model.set_cpu_weight_packing(False)
        generate = gs.hf_generate(model)
    load_s, after_load = time.perf_counter() - start, common.peak_rss_mib()
    generate(gs.source_ids(16), 4, gs.NEW_TOKENS)
    return {"peak_rss_mib": common.peak_rss_mib(), "peak_rss_after_load_mib": after_load, "interpreter_mib": baseline,
            "load_s": load_s, "torch_imported": "torch" in sys.modules}  # fmt: skip


def export_child(system: str, workdir: Path) -> dict:
    """Import the exporter, then export the saved model to a new folder."""
    start, quantization = time.perf_counter(), system.split()[-2]
    if system.startswith("CTranslate2"):
        import ctranslate2.converters  # noqa: F401

        source, convert = workdir / "marian", common.convert_ct2
    else:
        import vanilla_transformer.export.onnx.export  # noqa: F401

        source, convert = workdir / "vanilla", common.export_onnx
    imports_s, out = time.perf_counter() - start, Path(tempfile.mkdtemp(prefix="export-", dir=workdir))
    try:
        start = time.perf_counter()
        convert(source, out, quantization)
        export_s = time.perf_counter() - start
        size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return {"export_s": export_s, "imports_s": imports_s, "output_mib": size / 2**20}


def main(argv: list[str] | None = None) -> dict:
    parser = common.parser(__doc__, None, rounds=1)
    parser.add_argument("--exports", action="store_true", help="time the exports instead (rounds interleaved)")
    parser.add_argument("--systems", nargs="*", choices=[*FOLDERS, *EXPORTS], default=None)
    parser.add_argument("--workdir", type=Path, default=common.DEFAULT_WORKDIR, help="where the models are cached")
    parser.add_argument("--child", choices=[*FOLDERS, *EXPORTS], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child in EXPORTS:  # inside the fresh process
        return print(json.dumps(export_child(args.child, args.workdir)))
    if args.child:
        return print(json.dumps(memory_child(args.child, args.workdir / FOLDERS[args.child], args.threads)))

    common.prepare_artifacts(args.workdir, with_onnx=not args.exports)
    systems = args.systems or (EXPORTS if args.exports else list(FOLDERS))
    runs: dict[str, list[dict]] = {system: [] for system in systems}
    for round_idx in range(args.rounds):  # interleaved, one fresh process per system and round
        for system in systems:
            child = ["-m", "benchmarks.memory", "--child", system, "--workdir", str(args.workdir)]
            runs[system].append(common.run_child([sys.executable, *child, "--threads", str(args.threads)]))
            common.log(f"  round {round_idx + 1} {system}: {runs[system][-1]}")
    if args.exports:
        results = {system: common.summarize([r["export_s"] for r in rs]) | rs[-1] | {"runs": rs}
                   for system, rs in runs.items()}  # fmt: skip
        rows = [[s, f"{r['median']:.1f}", f"{r['min']:.1f}", f"{r['output_mib']:.0f}"] for s, r in results.items()]
        print(common.format_table(["export", "median s", "min s", "output MiB"], rows))
    else:
        results = {system: rs[-1] for system, rs in runs.items()}
        reference = results.get("vanilla PyTorch", {}).get("peak_rss_mib", float("nan"))
        rows = [[system, f"{r['peak_rss_mib']:.0f}", f"{r['peak_rss_after_load_mib']:.0f}", f"{r['load_s']:.1f}",
                 "yes" if r["torch_imported"] else "no", f"{r['peak_rss_mib'] / reference:.0%}"]
                for system, r in results.items()]  # fmt: skip
        headers = ["path", "peak RSS MiB", "after load MiB", "load s", "torch imported", "of vanilla PyTorch"]
        print(common.format_table(headers, rows))
    output = args.output or ("export_time" if args.exports else "memory")
    return common.save_results(output, "memory", argv, machine=common.machine_info(args.threads),
                               settings=vars(args), results=results)  # fmt: skip


if __name__ == "__main__":
    main()
