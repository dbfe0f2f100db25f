"""One trained model in every runtime it exports to, on the same sentences and the same machine, in one run:
this package's onnxruntime runtime on its own layout, 🤗 Optimum's `ORTModelForSeq2SeqLM` and transformers.js (Node)
on the standard layout, and CTranslate2 — sentences/s at batch 1 and 16, greedy and beam 4, fp32 everywhere.

    python -m benchmarks.ecosystem_runtimes --model outputs/main_job/model --texts outputs/main_job/data/test.tsv

Each runtime translates the first `--count` sentences of `--texts` (column 1 of a TSV with a header) in batches of
1 and 16 (sorted by length, as every runtime here would be fed in production), `--rounds` times; the table shows the
median. Every runtime gets `--threads` intra-op threads, `--max_new_tokens`, length penalty 1.0, no sampling and beam
search's early stopping (as the exported generation_config.json says; CTranslate2 always stops so); the
share of translations identical to this package's runtime is printed beside each figure, so a faster runtime that
translates differently shows it. Optimum runs in its own virtual environment (it pins transformers < 4.58) and
transformers.js from the pinned npm installation of the tests (tests/ecosystem_envs.py, tests/js/npm_cache.py),
both built on first use. The runtimes run one after the other, not interleaved. transformers.js 4.x has no beam search
(its generate() keeps one sequence per input whatever num_beams says): its beam rows read n/a.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.common import format_table, machine_info, save_results

BENCHMARK = "ecosystem_runtimes"
WORKLOADS = {
    "greedy, batch 1": (1, 1),
    "greedy, batch 16": (16, 1),
    "beam 4, batch 1": (1, 4),
    "beam 4, batch 16": (16, 4),
}
HERE = Path(__file__).resolve().parent


def read_sources(path: Path, count: int) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()[1:]
    sources = [line.split("\t")[0] for line in lines if line.strip()][:count]
    return sorted(sources, key=len)  # similar lengths batched together, in every runtime alike


def export_all(model: Path, work: Path, log=print) -> dict[str, Path]:
    """The model in this package's ONNX layout, the standard layout and CTranslate2, under `work` (fp32)."""
    from vanilla_transformer.export.cli import quiet_exporter
    from vanilla_transformer.export.ctranslate2_export import export_ctranslate2
    from vanilla_transformer.export.onnx_export import export_model
    from vanilla_transformer.export.onnx_standard_layout import export_standard_layout

    # transformers.js finds a local model by a Hub-id-like folder name
    folders = {"vanilla": work / "vanilla-onnx", "standard": work / "standard-onnx", "ct2": work / "ct2"}
    if not (folders["vanilla"] / "encoder_model.onnx").is_file():
        log("exporting this package's ONNX layout ...")
        with quiet_exporter():
            export_model(model, folders["vanilla"])
    if not (folders["standard"] / "onnx" / "decoder_model_merged.onnx").is_file():
        log("exporting the standard layout ...")
        with quiet_exporter():
            export_standard_layout(model, folders["standard"], overwrite=True)
    if not (folders["ct2"] / "model.bin").is_file():
        log("exporting to CTranslate2 ...")
        export_ctranslate2(model, folders["ct2"], force=True)
    return folders


def time_batches(translate, sentences: list[str], batch: int, rounds: int) -> dict:
    seconds, texts = [], []
    for _ in range(rounds):
        texts = []
        start = time.perf_counter()
        for first in range(0, len(sentences), batch):
            texts += translate(sentences[first : first + batch])
        seconds.append(time.perf_counter() - start)
    return {"seconds": seconds, "texts": texts}


def run_ours(folder: Path, sentences: list[str], args) -> dict:
    from vanilla_transformer_ort import OrtTranslator

    translator = OrtTranslator(folder, provider="cpu", intra_op_num_threads=args.threads)
    results = {}
    for name, (batch, beams) in WORKLOADS.items():

        def translate(texts, beams=beams):
            return translator.translate(
                texts, num_beams=beams, max_new_tokens=args.max_new_tokens, length_penalty=1.0, early_stopping=True
            )

        results[name] = time_batches(translate, sentences, batch, args.rounds)
    return results


def run_ctranslate2(folder: Path, sentences: list[str], args) -> dict:
    import ctranslate2
    from tokenizers import Tokenizer

    from vanilla_transformer.export.ctranslate2_export import generation_options

    translator = ctranslate2.Translator(str(folder), device="cpu", intra_threads=args.threads, inter_threads=1)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    results = {}
    for name, (batch, beams) in WORKLOADS.items():
        options = generation_options(num_beams=beams, max_new_tokens=args.max_new_tokens)

        def translate(texts, options=options):
            source = [encoding.tokens for encoding in tokenizer.encode_batch(texts)]
            output = translator.translate_batch(source, **options)
            ids = [[tokenizer.token_to_id(token) for token in result.hypotheses[0]] for result in output]
            return tokenizer.decode_batch(ids, skip_special_tokens=True)

        results[name] = time_batches(translate, sentences, batch, args.rounds)
    return results


def request_file(work: Path, folder: Path, sentences: list[str], args) -> Path:
    request = {
        "folder": str(folder), "sentences": sentences, "threads": args.threads, "rounds": args.rounds,
        "max_new_tokens": args.max_new_tokens,
        "runs": {name: {"batch": batch, "num_beams": beams} for name, (batch, beams) in WORKLOADS.items()},
    }  # fmt: skip
    path = work / "request.json"
    path.write_text(json.dumps(request))
    return path


def run_child_json(command: list[str]) -> dict:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{command[0]} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_optimum(folder: Path, sentences: list[str], args, work: Path) -> dict:
    from tests.ecosystem_envs import ecosystem_env, env_python
    from tests.test_optimum_interop import OPTIMUM_STEPS

    python = env_python(ecosystem_env("optimum", OPTIMUM_STEPS))
    request = request_file(work, folder, sentences, args)
    return run_child_json([str(python), str(HERE / "ecosystem" / "optimum_timing.py"), str(request)])


def run_transformers_js(folder: Path, sentences: list[str], args, work: Path) -> dict:
    from tests.js.npm_cache import ensure_installed

    installed = ensure_installed()
    script = installed / "transformers_js_timing.mjs"  # beside node_modules, where Node resolves the import
    shutil.copyfile(HERE / "ecosystem" / "transformers_js_timing.mjs", script)
    request = request_file(work, folder, sentences, args)
    return run_child_json(["node", str(script), str(request)])


def summarize(results: dict, reference: dict, count: int) -> dict:
    rows = {}
    for name, result in results.items():
        if "error" in result:
            rows[name] = {"error": result["error"]}
            continue
        median = statistics.median(result["seconds"])
        same = sum(a == b for a, b in zip(result["texts"], reference[name]["texts"], strict=True))
        rows[name] = {"sentences_per_second": count / median, "seconds": result["seconds"], "same_text": same}
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="a trained model folder")
    parser.add_argument("--texts", type=Path, required=True, help="TSV with a header; column 1 is translated")
    parser.add_argument("--count", type=int, default=64, help="sentences (default 64)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--work", type=Path, default=None, help="folder for the exports (default: a temporary one)")
    parser.add_argument("--name", default=BENCHMARK, help="results file name under benchmarks/results/")
    args = parser.parse_args(argv)

    work = args.work or Path(tempfile.mkdtemp(prefix="vt-ecosystem-"))
    work.mkdir(parents=True, exist_ok=True)
    sentences = read_sources(args.texts, args.count)
    folders = export_all(args.model, work)
    runtimes = {"this package's runtime (own layout)": lambda: run_ours(folders["vanilla"], sentences, args)}
    runtimes["CTranslate2 (vt-export-ctranslate2)"] = lambda: run_ctranslate2(folders["ct2"], sentences, args)
    runtimes["Optimum ORTModelForSeq2SeqLM (standard layout)"] = lambda: run_optimum(
        folders["standard"], sentences, args, work
    )
    runtimes["transformers.js, Node (standard layout)"] = lambda: run_transformers_js(
        folders["standard"], sentences, args, work
    )
    raw = {}
    for runtime, run in runtimes.items():
        print(f"timing {runtime} ...", flush=True)
        raw[runtime] = run()
    reference = raw["this package's runtime (own layout)"]
    summary = {runtime: summarize(results, reference, len(sentences)) for runtime, results in raw.items()}

    rows = []
    for runtime, workloads in summary.items():
        cells = []
        for name in WORKLOADS:
            row = workloads[name]
            cells.append(
                f"n/a ({row['error'][:60]})"
                if "error" in row
                else f"{row['sentences_per_second']:.1f} ({row['same_text']}/{len(sentences)})"
            )
        rows.append([runtime, *cells])
    print(f"\nsentences/s (translations identical to this package's runtime), {len(sentences)} sentences:")
    print(format_table(["runtime", *WORKLOADS], rows))
    settings = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
    settings["work"] = str(work)
    return save_results(
        args.name, BENCHMARK, argv, machine=machine_info(args.threads), settings=settings,
        results=summary,
    )  # fmt: skip


if __name__ == "__main__":
    main()
