"""One trained model in this package's runtime, 🤗 Optimum, transformers.js (Node) and CTranslate2: sentences/s and the
translations equal to this package's runtime's; docs/benchmarks.md#runtimes-of-the-ecosystem."""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks import common

WORKLOADS = {f"{search}, batch {batch}": (batch, beams) for search, beams in (("greedy", 1), ("beam 4", 4))
             for batch in (1, 16)}  # name -> (batch, num_beams)  # fmt: skip
HERE = Path(__file__).resolve().parent
OURS = "this package's runtime (own layout)"


def export_all(model: Path, work: Path) -> dict[str, Path]:
    """The model in this package's ONNX layout, the standard layout and CTranslate2, under `work` (fp32)."""
    from vanilla_transformer.export.cli import quiet_exporter
    from vanilla_transformer.export.ctranslate2_export import export_ctranslate2
    from vanilla_transformer.export.onnx.standard_layout import export_standard_layout

    # transformers.js finds a local model by a Hub-id-like folder name
    folders = {"vanilla": work / "vanilla-onnx", "standard": work / "standard-onnx", "ct2": work / "ct2"}
    with quiet_exporter():
        if not (folders["vanilla"] / "encoder_model.onnx").is_file():
            common.export_onnx(model, folders["vanilla"])
        if not (folders["standard"] / "onnx" / "decoder_model_merged.onnx").is_file():
            export_standard_layout(model, folders["standard"], overwrite=True)
    if not (folders["ct2"] / "model.bin").is_file():
        export_ctranslate2(model, folders["ct2"], force=True)
    return folders


def time_workloads(translate, sentences: list[str], args) -> dict:
    """`translate(texts, num_beams)` over the sentences in each workload's batches, `--rounds` times."""
    results = {}
    for name, (batch, beams) in WORKLOADS.items():
        seconds, texts = [], []
        for _ in range(args.rounds):
            start = time.perf_counter()
            texts = [text for first in range(0, len(sentences), batch)
                     for text in translate(sentences[first : first + batch], beams)]  # fmt: skip
            seconds.append(time.perf_counter() - start)
        results[name] = {"seconds": seconds, "texts": texts}
    return results


def run_elsewhere(program: list[str], folder: Path, sentences: list[str], args) -> dict:
    """A timing script in another interpreter (Optimum's environment, Node) reading one request file."""
    runs = {name: {"batch": batch, "num_beams": beams} for name, (batch, beams) in WORKLOADS.items()}
    request = {"folder": str(folder), "sentences": sentences, "threads": args.threads, "rounds": args.rounds,
               "max_new_tokens": args.max_new_tokens, "runs": runs}  # fmt: skip
    path = args.workdir / "request.json"
    path.write_text(json.dumps(request))
    return common.run_child([*program, str(path)])


def run_optimum(folder: Path, sentences: list[str], args) -> dict:
    from tests.ecosystem_envs import ecosystem_env, env_python
    from tests.test_optimum_interop import OPTIMUM_STEPS

    python = env_python(ecosystem_env("optimum", OPTIMUM_STEPS))
    return run_elsewhere([str(python), str(HERE / "ecosystem" / "optimum_timing.py")], folder, sentences, args)


def run_transformers_js(folder: Path, sentences: list[str], args) -> dict:
    from tests.js.npm_cache import ensure_installed

    script = ensure_installed() / "transformers_js_timing.mjs"  # beside node_modules, where Node resolves the import
    shutil.copyfile(HERE / "ecosystem" / "transformers_js_timing.mjs", script)
    return run_elsewhere(["node", str(script)], folder, sentences, args)


def summary(result: dict, ours: list[str]) -> dict:
    """Sentences per second (median round) and how many translations equal this package's runtime's."""
    if "error" in result:
        return {"error": result["error"]}
    same = sum(a == b for a, b in zip(result["texts"], ours, strict=True))
    return {"sentences_per_second": len(ours) / statistics.median(result["seconds"]), "same_text": same,
            "seconds": result["seconds"]}  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    parser = common.parser(__doc__.split("\n\n")[0], "ecosystem_runtimes", rounds=3)
    parser.add_argument("--model", type=Path, required=True, help="a trained model folder")
    parser.add_argument("--texts", type=Path, required=True, help="TSV with a header; column 1 is translated")
    parser.add_argument("--count", type=int, default=64, help="sentences (default 64)")
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--workdir", type=Path, default=None, help="folder for the exports (default: a temporary one)")
    args = parser.parse_args(argv)

    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="vt-ecosystem-"))
    args.workdir.mkdir(parents=True, exist_ok=True)
    sentences = sorted(common.read_tsv(args.texts, args.count)[0], key=len)  # similar lengths batched together
    folders = export_all(args.model, args.workdir)
    from vanilla_transformer_ort import OrtTranslator

    ours = OrtTranslator(folders["vanilla"], provider="cpu", intra_op_num_threads=args.threads)
    ct2 = common.ct2_translate(folders["ct2"], args.threads)
    options = {"max_new_tokens": args.max_new_tokens, "length_penalty": 1.0}  # CTranslate2 always stops early
    runtimes = {
        OURS: lambda: time_workloads(lambda texts, beams: ours.translate(texts, num_beams=beams, early_stopping=True,
                                                                         **options), sentences, args),
        "CTranslate2 (vt-export-ctranslate2)": lambda: time_workloads(
            lambda texts, beams: ct2(texts, {"num_beams": beams, **options}), sentences, args),
        "Optimum ORTModelForSeq2SeqLM (standard layout)": lambda: run_optimum(folders["standard"], sentences, args),
        "transformers.js, Node (standard layout)": lambda: run_transformers_js(folders["standard"], sentences, args),
    }  # fmt: skip
    raw = {}
    for runtime, run in runtimes.items():
        print(f"timing {runtime} ...", flush=True)
        raw[runtime] = run()
    results = {runtime: {name: summary(r, raw[OURS][name]["texts"]) for name, r in workloads.items()}
               for runtime, workloads in raw.items()}  # fmt: skip
    cell = "n/a ({error:.60})", "{sentences_per_second:.1f} ({same_text}/" + str(len(sentences)) + ")"
    rows = [[runtime, *(cell["error" not in r].format(**r) for r in workloads.values())]
            for runtime, workloads in results.items()]  # fmt: skip
    print(f"\nsentences/s (translations identical to this package's runtime), {len(sentences)} sentences:")
    print(common.format_table(["runtime", *WORKLOADS], rows))
    return common.save_results(args.output, "ecosystem_runtimes", argv, machine=common.machine_info(args.threads),
                               settings=vars(args), results=results)  # fmt: skip


if __name__ == "__main__":
    main()
