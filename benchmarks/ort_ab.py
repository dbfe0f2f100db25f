"""Two ONNX export folders of the same model, timed interleaved on the same inputs: the A/B of a graph change.

    python -m benchmarks.ort_ab BEFORE_FOLDER AFTER_FOLDER --rounds 7

Each row (batch 16 and 1, beam 4 and greedy) translates the same random 24-token sources into exactly 32 new tokens
(`generate_speed`'s workload) with one `OrtTranslator` per folder, 2 threads, the two alternating round after round
after a warm-up. Prints medians, minimums, the after/before ratio and whether the tokens are identical. Make the
"before" folder with the earlier exporter, e.g. from a `git worktree` of the earlier commit:

    git worktree add /tmp/before COMMIT && (cd /tmp/before && python -c "from pathlib import Path; \\
        from vanilla_transformer.export.onnx_export import export_model; export_model(Path(MODEL), Path(BEFORE))")
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

import numpy as np

from benchmarks import common
from benchmarks.generate_speed import ort_generate

ROWS = {"beam 4, batch 16": (16, 4), "greedy, batch 16": (16, 1), "beam 4, batch 1": (1, 4), "greedy, batch 1": (1, 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path, help="export folder A")
    parser.add_argument("after", type=Path, help="export folder B")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    common.pin_threads(args.threads)
    before, after = ort_generate(args.before, args.threads), ort_generate(args.after, args.threads)
    vocab = json.loads((args.before / "config.json").read_text())["vocab_size"]
    rng = np.random.default_rng(0)
    print("| row | before s (min) | after s (min) | after / before | same tokens |\n|---|---|---|---|---|")
    for name, (batch, beams) in ROWS.items():
        ids = rng.integers(5, vocab - 1, (batch, 24))  # no special ids at the ends
        same = before(ids, beams) == after(ids, beams)  # also the warm-up
        systems = {key: partial(run, ids, beams) for key, run in (("before", before), ("after", after))}
        times = common.run_interleaved(systems, args.rounds, warmup=0)
        stats = {key: common.summarize(t) for key, t in times.items()}
        a, b = stats["before"], stats["after"]
        print(
            f"| {name} | {a['median']:.3f} ({a['min']:.3f}) | {b['median']:.3f} ({b['min']:.3f}) | "
            f"{b['median'] / a['median']:.3f} | {same} |"
        )


if __name__ == "__main__":
    main()
