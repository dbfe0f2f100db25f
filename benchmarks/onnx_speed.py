"""PyTorch `generate()` vs onnxruntime fp32 vs onnxruntime int8, side by side, on CPU.

    python -m benchmarks.onnx_speed                       # base-preset dims, random weights, 2 threads
    python -m benchmarks.onnx_speed --model runs/demo --eval-tsv ../shared/data/gettext-en-de/test.tsv

Cases: greedy at batch 1 and beam 4 at batch 16, a 24-token source, exactly 32 new tokens (EOS banned until then:
`min_new_tokens = max_new_tokens`). Each figure is the best of `--repeats` runs after one warm-up, PyTorch and the
two exports taking turns with two fp32 matmuls of 2048^3 (torch.mm, and onnxruntime's MatMul on a constant, prepacked
matrix): the faster of the two is taken as this machine's sgemm peak. With `--model` and
`--eval-tsv` it also reports the BLEU of the fp32 and int8 exports of that model (the int8 accuracy cost).

Each case also prints its fp32 floor: the generation's matmul FLOPs (`benchmarks.common.generation_matmul_flops`)
at the sgemm peak, and so the largest speedup over PyTorch that any fp32 runtime could reach on this machine.
Results go to `benchmarks/results/onnx_speed.json`.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from benchmarks import common
from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.export.onnx_export import export_model
from vanilla_transformer_ort import OrtTranslator
from vanilla_transformer_ort.contract import DECODER_FILE
from vanilla_transformer_ort.sessions import session_options

CASES = [("greedy", 1, 1), ("beam 4", 4, 16)]  # (name, num_beams, batch)
TARGETS = {"fp32": 2.0, "int8": 4.0}
SGEMM_N = 2048


def random_model(folder: Path, vocab_size: int, preset: str = "base") -> None:
    """A preset's dimensions with random weights, plus a word-level tokenizer so the export is complete."""
    torch.manual_seed(0)
    config = VanillaTransformerConfig.from_preset(preset, vocab_size=vocab_size)
    VanillaTransformerForConditionalGeneration(config).save_pretrained(folder)
    vocab = {token: i for i, token in enumerate(["<pad>", "<s>", "</s>", "<unk>"])}
    vocab.update({f"w{i}": i for i in range(4, vocab_size)})
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>").save_pretrained(folder)


def interleaved_best(repeats: int, runs: dict) -> dict[str, tuple[float, np.ndarray]]:
    """Best time of each run after one warm-up, the runs taking turns so that load changes hit them all alike."""
    outputs = {name: run() for name, run in runs.items()}
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            outputs[name] = run()
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: (best[name], outputs[name]) for name in runs}


def source_batch(batch: int, length: int, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    input_ids = rng.integers(4, vocab_size, (batch, length), dtype=np.int64)
    input_ids[:, -1] = 2  # </s>
    return input_ids, np.ones_like(input_ids)


def torch_generate(model, source: tuple[np.ndarray, np.ndarray], options: dict) -> np.ndarray:
    with torch.no_grad():
        input_ids, attention_mask = (torch.from_numpy(a) for a in source)
        return model.generate(input_ids=input_ids, attention_mask=attention_mask, **options).numpy()


def agreement(reference: np.ndarray, other: np.ndarray) -> str:
    if reference.shape == other.shape and np.array_equal(reference, other):
        return "identical"
    if reference.shape != other.shape:
        return f"shapes {reference.shape} vs {other.shape}"
    return f"{np.mean(reference == other):.1%} of tokens"


def bleu_change(model_dir: Path, folders: dict[str, Path], tsv: Path, limit: int, threads: int) -> dict[str, float]:
    import sacrebleu

    rows = [line.rstrip("\n").split("\t") for line in tsv.read_text(encoding="utf-8").splitlines()[1 : limit + 1]]
    sources, references = [r[0] for r in rows], [r[1] for r in rows]
    scores = {}
    for name, folder in folders.items():
        translator = OrtTranslator(folder, provider="cpu", intra_op_num_threads=threads)
        hypotheses = []
        for start in range(0, len(sources), 32):
            hypotheses += translator.translate(sources[start : start + 32], num_beams=4)
        scores[name] = sacrebleu.corpus_bleu(hypotheses, [references]).score
        print(f"BLEU {name:5s} {scores[name]:6.2f}  ({len(sources)} sentences, beam 4)")
    return scores


def sgemm_runs(work: Path, threads: int) -> dict:
    """Two (n x n) @ (n x n) fp32 products timed in the same turns as the generations: torch.mm, and onnxruntime's
    MatMul with a constant right-hand side (which it prepacks, as it does the model's weights). The faster one is this
    machine's fp32 matmul peak."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    a, b = torch.randn(SGEMM_N, SGEMM_N), torch.randn(SGEMM_N, SGEMM_N)
    out = torch.empty(SGEMM_N, SGEMM_N)
    path = work / "sgemm.onnx"
    if not path.is_file():
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["a", "b"], ["c"])],
            "sgemm",
            [helper.make_tensor_value_info("a", TensorProto.FLOAT, [SGEMM_N, SGEMM_N])],
            [helper.make_tensor_value_info("c", TensorProto.FLOAT, [SGEMM_N, SGEMM_N])],
            [numpy_helper.from_array(b.numpy(), "b")],
        )
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), path)
    session = ort.InferenceSession(str(path), session_options(threads), providers=["CPUExecutionProvider"])
    feed = {"a": a.numpy()}
    return {"sgemm torch": lambda: torch.mm(a, b, out=out), "sgemm onnxruntime": lambda: session.run(None, feed)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="trained model folder (default: random base)")
    parser.add_argument("--work-dir", type=Path, default=None, help="where exports go (default: a temp dir)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--source-len", type=int, default=24)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--eval-tsv", type=Path, default=None, help="source<TAB>reference file for the BLEU change")
    parser.add_argument("--eval-limit", type=int, default=300)
    parser.add_argument("--name", default="onnx_speed", help="results file name under benchmarks/results/")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="onnx-speed-"))
    model_dir = args.model
    if model_dir is None:
        model_dir = work / "model"
        if not (model_dir / "config.json").is_file():
            random_model(model_dir, args.vocab_size)
    folders = {"fp32": work / "onnx-fp32", "int8": work / "onnx-int8"}
    for name, folder in folders.items():
        if not (folder / DECODER_FILE).is_file():
            start = time.perf_counter()
            export_model(model_dir, folder, quantize="int8" if name == "int8" else None)
            print(f"exported {name} in {time.perf_counter() - start:.0f} s")
        sizes = {p.name: p.stat().st_size / 2**20 for p in folder.glob("*.onnx")}
        print(f"{name}: " + ", ".join(f"{k} {v:.1f} MiB" for k, v in sorted(sizes.items())))

    model = VanillaTransformerForConditionalGeneration.from_pretrained(model_dir).eval()
    translators = {n: OrtTranslator(f, provider="cpu", intra_op_num_threads=args.threads) for n, f in folders.items()}
    config = model.config
    print(
        f"\nd_model {config.d_model}, {config.encoder_layers}+{config.decoder_layers} layers, "
        f"vocab {config.vocab_size}; {args.threads} threads; source {args.source_len}; {args.new_tokens} new tokens"
    )
    header = f"{'case':18s} {'PyTorch':>10s} {'ORT fp32':>10s} {'speedup':>8s} {'ORT int8':>10s} {'speedup':>8s}"
    print(header + "  fp32 tokens == PyTorch   int8 tokens == fp32")
    dims = common.Dims(
        d_model=config.d_model,
        d_ff=config.encoder_ffn_dim,
        encoder_layers=config.encoder_layers,
        decoder_layers=config.decoder_layers,
        heads=config.encoder_attention_heads,
        vocab_size=config.vocab_size,
    )
    cases, floors = {}, []
    for name, num_beams, batch in CASES:
        source = source_batch(batch, args.source_len, config.vocab_size)
        options = {"num_beams": num_beams, "max_new_tokens": args.new_tokens, "min_new_tokens": args.new_tokens}
        runs = {"torch": functools.partial(torch_generate, model, source, options)}
        runs.update({n: functools.partial(t.generate, *source, **options) for n, t in translators.items()})
        runs.update(sgemm_runs(work, args.threads))
        results = interleaved_best(args.repeats, runs)
        (torch_s, torch_out), (fp32_s, fp32_out), (int8_s, int8_out) = (results[n] for n in ("torch", "fp32", "int8"))
        label = f"{name} batch {batch}"
        print(
            f"{label:18s} {torch_s * 1e3:8.0f}ms {fp32_s * 1e3:8.0f}ms {torch_s / fp32_s:7.2f}x "
            f"{int8_s * 1e3:8.0f}ms {torch_s / int8_s:7.2f}x  {agreement(torch_out, fp32_out):22s}  "
            f"{agreement(fp32_out, int8_out)}"
        )
        rates = {n: common.sgemm_gflops(results[n][0], SGEMM_N) for n in results if n.startswith("sgemm")}
        peak = max(rates.values())
        flops = common.generation_matmul_flops(dims, batch, num_beams, args.source_len, args.new_tokens)
        floor_s = flops / (peak * 1e9)
        floors.append(
            f"{label}: {flops / 1e9:.1f} GFLOP of matmuls at the sgemm peak ({peak:.0f} GFLOP/s) take "
            f"{floor_s * 1e3:.0f} ms, PyTorch's time / {torch_s / floor_s:.2f}"
        )
        cases[label] = {
            "num_beams": num_beams,
            "batch": batch,
            "seconds": {"pytorch": torch_s, "ort_fp32": fp32_s, "ort_int8": int8_s},
            "speedup": {"ort_fp32": torch_s / fp32_s, "ort_int8": torch_s / int8_s},
            "tokens": {
                "fp32_vs_pytorch": agreement(torch_out, fp32_out),
                "int8_vs_fp32": agreement(fp32_out, int8_out),
            },
            "matmul_gflop": flops / 1e9,
            "sgemm_gflops": rates,
            "sgemm_peak_gflops": peak,
            "fp32_floor_seconds": floor_s,
            "max_fp32_speedup": torch_s / floor_s,
        }
    print(f"targets: ORT fp32 >= {TARGETS['fp32']:.0f}x, ORT int8 >= {TARGETS['int8']:.0f}x PyTorch generate()")
    print("fp32 floor (the most any fp32 runtime could gain over PyTorch on this machine):")
    for line in floors:
        print("  " + line)
    bleu = None
    if args.eval_tsv is not None:
        bleu = bleu_change(model_dir, folders, args.eval_tsv, args.eval_limit, args.threads)
    return common.save_results(
        args.name,
        "onnx_speed",
        argv,
        machine=common.machine_info(args.threads),
        settings={"source_len": args.source_len, "new_tokens": args.new_tokens, "repeats": args.repeats},
        targets=TARGETS,
        cases=cases,
        bleu=bleu,
    )


if __name__ == "__main__":
    main()
