"""Beam search's per-step overheads in the runtime, each change against what it replaced, in one process.

    python -m benchmarks.beam_ranking                                        # ranking graph, base-size generation
    vt-export-onnx --model outputs/main_job/model --output outputs/main_job/onnx-int8 --quantize int8
    python -m benchmarks.beam_ranking --model outputs/main_job/onnx-int8     # + test sentences in batches of 32

1. **Ranking graph alone** (`beam_scores.onnx`): one `TopK` over each sentence's num_beams x V candidates (the graph
   before) against the two-stage top k (block maxima, then the best blocks' candidates), on the same random logits,
   at 128 rows x 8,000 (the main job's vocabulary, 32 sentences, 1 thread) and 64 rows x 32,000 (base, 16 sentences,
   2 threads); `--block_sizes` adds other blocks.
2. **Base-size generation** (the `generate_speed` folders, beam 4, batch 1 and 16, exactly 32 new tokens): the same
   translator with its ranking session swapped between the two graphs, interleaved.
3. **Test sentences** (`--model`, the serving shape: the English side of the gettext test split in batches of 32,
   beam 4, 1 thread, so sentences finish at different steps): the ranking graph before and after, and finished
   sentences leaving the batch by copying the kept rows into new buffers (before) against compacting the buffers in
   place (`InPlaceState.keep_rows`).

Every variant's tokens are compared with the first's before timing. Not a timed test.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import common

DEFAULT_TEXTS = Path(__file__).resolve().parents[2] / "shared" / "data" / "gettext-en-de" / "test.tsv"
GRAPH_SHAPES = ((128, 8000, 32, 1), (64, 32000, 16, 2))  # rows, vocabulary, sentences, threads


def _scores_model(vocab: int, block_size: int | None):
    import onnx

    from vanilla_transformer.export.onnx_helper_graphs import beam_scores_model

    opsets = [onnx.helper.make_opsetid("", 20)]
    return beam_scores_model(onnx.TensorProto.FLOAT, vocab, opsets, 10, block_size=block_size).SerializeToString()


def _session(model: bytes | Path, threads: int):
    from vanilla_transformer_ort.sessions import create_session, session_options

    options = session_options(threads, shared_cpu_arena=True)
    if isinstance(model, Path):
        return create_session(model, options, ["CPUExecutionProvider"])
    with tempfile.TemporaryDirectory() as folder:  # the session holds the graph once created
        path = Path(folder) / "beam_scores.onnx"
        path.write_bytes(model)
        return create_session(path, options, ["CPUExecutionProvider"])


def graph_alone(block_sizes: list[int], rounds: int, calls: int = 50) -> list[dict]:
    rows_out = []
    for rows, vocab, batch, threads in GRAPH_SHAPES:
        rng = np.random.default_rng(0)
        feed = {
            "logits": (rng.standard_normal((rows, 1, vocab)) * 3).astype(np.float32),
            "running_scores": rng.standard_normal((rows, 1)).astype(np.float32),
            "bias": np.where(np.arange(vocab) < 2, -np.inf, 0.0).astype(np.float32),
            "scores_shape": np.array([batch, -1], dtype=np.int64),
            "k": np.array([2 * rows // batch], dtype=np.int64),
        }
        sessions = {"one TopK": _session(_scores_model(vocab, None), threads)}
        for block in block_sizes:
            if vocab % block == 0:
                sessions[f"two stages, blocks of {block}"] = _session(_scores_model(vocab, block), threads)
        reference = sessions["one TopK"].run(None, feed)
        for name, session in sessions.items():
            values, indices = session.run(None, feed)
            if not (np.array_equal(values, reference[0]) and np.array_equal(indices, reference[1])):
                raise RuntimeError(f"{name} ranks differently from one TopK")
        systems = {
            name: (lambda s=session, f=feed: [s.run(None, f) for _ in range(calls)])
            for name, session in sessions.items()
        }
        times = common.run_interleaved(systems, rounds)
        for name, values in times.items():
            summary = common.summarize([t / calls * 1e3 for t in values])
            rows_out.append({"shape": f"{rows} rows x {vocab}, {threads} thread(s)", "system": name, **summary})
    return rows_out


def _copying_keep_rows(self, rows: np.ndarray) -> None:
    """`InPlaceState.keep_rows` before: the kept rows copied into new buffers, every cache position included."""
    self.buffers = {name: np.ascontiguousarray(buffer[rows]) for name, buffer in self.buffers.items()}
    sources = rows[:: self.num_beams] // self.num_beams
    self.cross = {name: value[sources] for name, value in self.cross.items()}
    self.mask = self.mask[sources]
    self._bind_sources()
    self._bind_cache()


def generation(translator, one_stage, two_stage, workloads: dict, rounds: int, pruning_ab: bool) -> list[dict]:
    """Each workload under each variant, interleaved; the variants' outputs must agree."""
    from vanilla_transformer_ort.decoder_state import InPlaceState

    in_place = InPlaceState.keep_rows
    variants = {"before (one TopK)": (one_stage, None), "two-stage ranking": (two_stage, None)}
    if pruning_ab:
        variants = {
            "before (one TopK, copying pruning)": (one_stage, _copying_keep_rows),
            "two-stage ranking, copying pruning": (two_stage, _copying_keep_rows),
            "two-stage ranking, in-place pruning": (two_stage, in_place),
        }

    def run(variant, work):
        session, keep_rows = variants[variant]
        translator.beam_scores = session
        InPlaceState.keep_rows = keep_rows or in_place
        try:
            return work()
        finally:
            InPlaceState.keep_rows = in_place

    results = []
    for label, work in workloads.items():
        outputs = {name: run(name, work) for name in variants}
        first = next(iter(outputs.values()))
        for name, output in outputs.items():
            if json.dumps(output, default=str) != json.dumps(first, default=str):
                raise RuntimeError(f"{label}: {name} gives other tokens than {next(iter(outputs))}")
        times = common.run_interleaved({name: (lambda n=name, w=work: run(n, w)) for name in variants}, rounds)
        for name, values in times.items():
            results.append({"workload": label, "system": name, **common.summarize(values)})
    return results


def _base_workloads(translator) -> dict:
    from benchmarks import generate_speed as gs

    def generate(batch):
        ids = gs.source_ids(batch)
        new = gs.NEW_TOKENS
        return lambda: translator.generate(
            ids, np.ones_like(ids), num_beams=4, min_new_tokens=new, max_new_tokens=new, forced_eos_token_id=None
        ).tolist()

    return {"beam 4, batch 1": generate(1), "beam 4, batch 16": generate(16)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block_sizes", type=int, nargs="*", default=[64])
    parser.add_argument("--threads", type=int, default=common.THREADS, help="threads of the base-size generation")
    parser.add_argument("--workdir", type=Path, default=common.DEFAULT_WORKDIR)
    parser.add_argument("--model", type=Path, default=None, help="an export folder for the test-sentence workload")
    parser.add_argument("--texts", type=Path, default=DEFAULT_TEXTS)
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--skip", nargs="*", default=[], choices=["graph", "base"])
    parser.add_argument("--name", default="beam_ranking")
    args = parser.parse_args(argv)

    from vanilla_transformer_ort import OrtTranslator

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    report: dict = {"machine": common.machine_info(args.threads), "started": started}
    if "graph" not in args.skip:
        report["graph"] = graph_alone(args.block_sizes, args.rounds)
        print("| shape | ranking graph | ms a step (median) | min |\n|---|---|---|---|")
        for row in report["graph"]:
            print(f"| {row['shape']} | {row['system']} | {row['median']:.2f} | {row['min']:.2f} |")

    def one_and_two_stage(translator, threads):
        from vanilla_transformer.export.onnx_helper_graphs import beam_scores_block_size

        vocab = translator.config["vocab_size"]
        block = beam_scores_block_size(vocab)
        if block is None:
            raise SystemExit(f"vocabulary {vocab} has no block size: nothing to compare")
        return _session(_scores_model(vocab, None), threads), _session(_scores_model(vocab, block), threads)

    report["generation"] = []
    if "base" not in args.skip:
        paths = common.prepare_artifacts(args.workdir)
        for variant in ("int8", "fp32"):
            translator = OrtTranslator(paths[f"onnx-{variant}"], provider="cpu", intra_op_num_threads=args.threads)
            one, two = one_and_two_stage(translator, args.threads)
            for row in generation(translator, one, two, _base_workloads(translator), args.rounds, pruning_ab=False):
                report["generation"].append({"folder": f"base {variant}", **row})
    if args.model is not None:
        lines = args.texts.read_text(encoding="utf-8").splitlines()[1:]
        texts = [line.split("\t")[0] for line in lines if line.strip()][: args.sentences]
        translator = OrtTranslator(args.model, provider="cpu", intra_op_num_threads=1)
        one, two = one_and_two_stage(translator, 1)
        work = {
            f"{len(texts)} test sentences, batches of 32": lambda: [
                translator.translate(texts[i : i + 32], num_beams=4) for i in range(0, len(texts), 32)
            ]
        }
        for row in generation(translator, one, two, work, args.rounds, pruning_ab=True):
            report["generation"].append({"folder": str(args.model), **row})
    if report["generation"]:
        print("\n| folder | workload | variant | s (median) | min | vs before |\n|---|---|---|---|---|---|")
        before = {}
        for row in report["generation"]:
            key = (row["folder"], row["workload"])
            before.setdefault(key, row["median"])
            ratio = before[key] / row["median"]
            print(
                f"| {row['folder']} | {row['workload']} | {row['system']} | {row['median']:.3f} | {row['min']:.3f} "
                f"| {ratio:.2f}x |"
            )
    out = Path(__file__).parent / "results" / f"{args.name}.json"
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
