"""Export time: this package's ONNX export (fp32, int8) next to CTranslate2's converter on the same-size Marian.

Each export runs in a fresh process from a saved folder into a new folder; the time covers loading the checkpoint,
converting and writing (the interpreter's start and library imports are reported apart).

    python -m benchmarks.export_time --rounds 2
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import common

EXPORTS = ["CTranslate2 fp32", "CTranslate2 int8", "vanilla ONNX fp32", "vanilla ONNX int8"]


def child(system: str, workdir: Path) -> dict:
    start = time.perf_counter()
    quantization = system.rsplit(" ", 1)[1]
    if system.startswith("CTranslate2"):
        import ctranslate2.converters  # noqa: F401

        convert = lambda out: common.convert_ct2(workdir / "marian", out, quantization)  # noqa: E731
    else:
        import vanilla_transformer.export.onnx_export  # noqa: F401

        convert = lambda out: common.export_onnx(workdir / "vanilla", out, quantization)  # noqa: E731
    imports_s = time.perf_counter() - start
    out = Path(tempfile.mkdtemp(prefix="export-", dir=workdir))
    try:
        _, export_s = common.timed(lambda: convert(out))
        size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    finally:
        shutil.rmtree(out, ignore_errors=True)
    return {"system": system, "export_s": export_s, "imports_s": imports_s, "output_mib": size / 2**20}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=common.DEFAULT_WORKDIR)
    parser.add_argument("--name", default="export_time")
    parser.add_argument("--child", choices=EXPORTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        print(json.dumps(child(args.child, args.workdir)))
        return {}

    common.prepare_artifacts(args.workdir, with_onnx=False, log=lambda m: print(m, file=sys.stderr))
    systems = [s for s in EXPORTS if "ONNX" not in s or common.onnx_available()]
    runs: dict[str, list[dict]] = {s: [] for s in systems}
    for round_idx in range(args.rounds):  # interleaved, one fresh process per export
        for system in systems:
            args_child = ["-m", "benchmarks.export_time", "--child", system, "--workdir", str(args.workdir)]
            result = common.run_child(args_child)
            runs[system].append(result)
            print(f"  round {round_idx + 1} {system:<20} {result['export_s']:.1f} s", file=sys.stderr, flush=True)
    results = {}
    rows = []
    for system, rs in runs.items():
        stats = common.summarize([r["export_s"] for r in rs])
        results[system] = stats | {"output_mib": rs[-1]["output_mib"], "imports_s": rs[-1]["imports_s"], "runs": rs}
        rows.append([system, f"{stats['median']:.1f}", f"{stats['min']:.1f}", f"{rs[-1]['output_mib']:.0f}"])
    table = common.format_table(["export", "median s", "min s", "output MiB"], rows)
    print(table)
    print(f"\nfresh process per export, {args.rounds} interleaved rounds; imports not included")
    return common.save_results(
        args.name,
        "export_time",
        argv,
        machine=common.machine_info(),
        results=results,
        table=table,
    )


if __name__ == "__main__":
    main()
