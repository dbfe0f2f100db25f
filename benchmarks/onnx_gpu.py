"""GPU serving: the fp16 export on onnxruntime's CUDA provider with I/O binding, beside PyTorch `generate()` there.

    python -m benchmarks.onnx_gpu                       # base-preset dims, random weights; needs onnxruntime-gpu + GPU
    python -m benchmarks.onnx_gpu --model runs/demo/model --batches 1 64 --num-beams 4
    python -m benchmarks.onnx_gpu --provider cpu --preset tiny --vocab-size 512 --batches 1 4   # the same path on CPU

For each batch size: a 24-token source, exactly 32 new tokens per row (EOS banned until then), the best of
`--repeats` runs after a warm-up, and tokens/s = batch x new tokens / seconds for
- onnxruntime fp16 (`export_model(dtype="fp16")`), I/O binding on: the KV cache stays on the device between steps and
  beams are reordered there by `cache_reorder.onnx`; only the logits come back each step;
- PyTorch `generate()` on the same device, fp16 and fp32 weights (`--torch-dtypes`).
It also reports how many of onnxruntime's tokens equal PyTorch fp32's (fp16 rounding changes some on random weights).
Run it in an environment with `pip install -e ".[gpu]"` and without the CPU `onnxruntime` package (they share one
directory). Results go to `benchmarks/results/onnx_gpu.json`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks import common
from benchmarks.onnx_speed import agreement, random_model, source_batch
from vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.export.onnx_export import export_model
from vanilla_transformer_ort import OrtTranslator
from vanilla_transformer_ort.contract import DECODER_FILE

TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def best_seconds(run, repeats: int) -> tuple[float, np.ndarray]:
    """Best wall time of `repeats` calls after one warm-up (the call returns host arrays, so it has synchronized)."""
    output = run()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        output = run()
        best = min(best, time.perf_counter() - start)
    return best, output


def torch_runner(model, source: tuple[np.ndarray, np.ndarray], options: dict, device: torch.device):
    input_ids, attention_mask = (torch.from_numpy(a).to(device) for a in source)

    def run() -> np.ndarray:
        with torch.inference_mode():
            return model.generate(input_ids=input_ids, attention_mask=attention_mask, **options).cpu().numpy()

    return run


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="trained model folder (default: random weights)")
    parser.add_argument("--preset", default="base", help="dimensions of the random model (default: base)")
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--work-dir", type=Path, default=None, help="where the export goes (default: a temp dir)")
    parser.add_argument("--provider", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--num-beams", type=int, default=1)
    parser.add_argument("--source-len", type=int, default=24)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (the CPU provider, and torch on CPU)")
    parser.add_argument(
        "--torch-dtypes",
        nargs="*",
        choices=list(TORCH_DTYPES),
        default=None,
        help="PyTorch runs beside onnxruntime (default: fp16 and fp32 on CUDA, fp32 on CPU)",
    )
    parser.add_argument("--name", default="onnx_gpu", help="results file name under benchmarks/results/")
    args = parser.parse_args(argv)

    device = torch.device("cuda" if args.provider == "cuda" else "cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--provider cuda needs a CUDA device visible to torch; use --provider cpu for a smoke run")
    torch.set_num_threads(args.threads)
    torch_dtypes = args.torch_dtypes
    if torch_dtypes is None:
        torch_dtypes = ["fp16", "fp32"] if device.type == "cuda" else ["fp32"]
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="onnx-gpu-"))
    model_dir = args.model
    if model_dir is None:
        model_dir = work / "model"
        if not (model_dir / "config.json").is_file():
            random_model(model_dir, args.vocab_size, args.preset)
    folder = work / "onnx-fp16"
    if not (folder / DECODER_FILE).is_file():
        start = time.perf_counter()
        export_model(model_dir, folder, dtype="fp16")
        print(f"exported fp16 in {time.perf_counter() - start:.0f} s")
    sizes = {p.name: p.stat().st_size / 2**20 for p in folder.glob("*.onnx")}
    print("fp16: " + ", ".join(f"{k} {v:.1f} MiB" for k, v in sorted(sizes.items())))

    translator = OrtTranslator(folder, provider=args.provider, intra_op_num_threads=args.threads, use_io_binding=True)
    models = {
        name: VanillaTransformerForConditionalGeneration.from_pretrained(model_dir, dtype=TORCH_DTYPES[name])
        .to(device)
        .eval()
        for name in torch_dtypes
    }
    if device.type == "cuda":
        hardware = torch.cuda.get_device_name(device)
    else:
        hardware = common.machine_info(args.threads)["cpu"]
    print(f"\n{hardware}; onnxruntime provider {translator.provider}; I/O binding on; num_beams {args.num_beams}")
    options = {"num_beams": args.num_beams, "max_new_tokens": args.new_tokens, "min_new_tokens": args.new_tokens}
    systems = ["ORT fp16", *(f"PyTorch {name}" for name in torch_dtypes)]
    print(f"{'batch':>6s} " + " ".join(f"{s + ' tok/s':>18s}" for s in systems) + "  ORT fp16 tokens == PyTorch fp32")
    results = {}
    for batch in args.batches:
        source = source_batch(batch, args.source_len, translator.config["vocab_size"])
        runs = {"ORT fp16": lambda source=source: translator.generate(*source, **options)}
        for name, model in models.items():
            runs[f"PyTorch {name}"] = torch_runner(model, source, options, device)
        timed = {name: best_seconds(run, args.repeats) for name, run in runs.items()}
        tokens = batch * args.new_tokens
        row = {name: {"seconds": s, "tokens_per_second": tokens / s} for name, (s, _) in timed.items()}
        if "PyTorch fp32" in timed:
            row["ORT fp16"]["tokens_vs_pytorch_fp32"] = agreement(timed["PyTorch fp32"][1], timed["ORT fp16"][1])
        results[str(batch)] = row
        print(
            f"{batch:6d} "
            + " ".join(f"{row[s]['tokens_per_second']:18.0f}" for s in systems)
            + f"  {row['ORT fp16'].get('tokens_vs_pytorch_fp32', '-')}"
        )
    return common.save_results(
        args.name,
        "onnx_gpu",
        argv,
        hardware=hardware,
        provider=translator.provider,
        settings={
            "num_beams": args.num_beams,
            "source_len": args.source_len,
            "new_tokens": args.new_tokens,
            "repeats": args.repeats,
            "model": str(args.model) if args.model else f"random {args.preset}, vocab {args.vocab_size}",
        },
        files_mib=sizes,
        results=results,
    )


if __name__ == "__main__":
    main()
