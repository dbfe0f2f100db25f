"""GPU tokens/s of the fp16 export on onnxruntime's CUDA provider with I/O binding beside PyTorch on the same device
(needs the `gpu` extra; `--provider cpu` for a smoke run); docs/experiments/onnx-speed.md."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from benchmarks import common
from benchmarks.generate_speed import hf_generate, ort_generate, source_ids, token_agreement
from vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer_ort.contract import MANIFEST_FILE

TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def main(argv: list[str] | None = None) -> dict:
    parser = common.parser(__doc__, "onnx_gpu", rounds=5)
    parser.add_argument("--model", type=Path, default=None, help="trained model folder (default: random weights)")
    parser.add_argument("--preset", default="base", help="dimensions of the random model (default: base)")
    parser.add_argument("--vocab_size", type=int, default=common.VOCAB_SIZE, help="of the random model")
    parser.add_argument("--workdir", type=Path, default=None, help="where the export goes (default: a temp dir)")
    parser.add_argument("--provider", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--num_beams", type=int, default=1)
    parser.add_argument("--new_tokens", type=int, default=32)
    parser.add_argument("--torch_dtypes", nargs="*", choices=list(TORCH_DTYPES), default=None,
                        help="PyTorch beside onnxruntime (default: fp16 and fp32 on CUDA, fp32 on CPU)")  # fmt: skip
    args = parser.parse_args(argv)

    device = torch.device("cuda" if args.provider == "cuda" else "cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--provider cuda needs a CUDA device visible to torch; use --provider cpu for a smoke run")
    common.pin_threads(args.threads)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="onnx-gpu-"))
    model_dir = args.model or work / "model"
    if args.model is None and not (model_dir / "config.json").is_file():
        model = common.build_vanilla(common.Dims(vocab_size=args.vocab_size), args.preset)
        common.save_with_tokenizer(model, model_dir, common.vanilla_vocabulary(args.vocab_size))
    folder = work / "onnx-fp16"
    if not (folder / MANIFEST_FILE).is_file():
        common.export_onnx(model_dir, folder, dtype="fp16")
    systems = {"ORT fp16": ort_generate(folder, args.threads, provider=args.provider, use_io_binding=True)}
    dtypes = args.torch_dtypes if args.torch_dtypes is not None else ["fp16", "fp32"][device.type == "cpu" :]
    for name in dtypes:
        model = VanillaTransformerForConditionalGeneration.from_pretrained(model_dir, dtype=TORCH_DTYPES[name])
        systems[f"PyTorch {name}"] = hf_generate(model.to(device).eval())
    translator = systems["ORT fp16"].translator
    machine = common.machine_info(args.threads) | {"provider": translator.provider}
    machine["gpu"] = torch.cuda.get_device_name(device) if device.type == "cuda" else None

    results = {}
    for batch in args.batches:
        ids = source_ids(batch, translator.config["vocab_size"])
        runs = {name: (lambda g=g, i=ids: g(i, args.num_beams, args.new_tokens)) for name, g in systems.items()}
        best = {name: min(t) for name, t in common.run_interleaved(runs, rounds=args.rounds).items()}
        results[str(batch)] = row = {name: {"seconds": s, "tokens_per_second": batch * args.new_tokens / s}
                                     for name, s in best.items()}  # fmt: skip
        same = "same_tokens_as_pytorch_fp32"
        if "PyTorch fp32" in runs:
            row["ORT fp16"][same] = token_agreement(runs["ORT fp16"](), runs["PyTorch fp32"]())
    rows = [[batch, *(f"{row[s]['tokens_per_second']:.0f}" for s in systems), f"{row['ORT fp16'].get(same, 0):.1%}"]
            for batch, row in results.items()]  # fmt: skip
    print(f"\n{machine['gpu'] or machine['cpu']}; {translator.provider}, I/O binding; beams {args.num_beams}")
    print(common.format_table(["batch", *(f"{s} tok/s" for s in systems), "ORT tokens = PyTorch fp32"], rows))
    sizes = {p.name: p.stat().st_size / 2**20 for p in folder.glob("*.onnx")}
    settings = {"model": args.model or f"random {args.preset}, vocab {args.vocab_size}", "num_beams": args.num_beams,
                "new_tokens": args.new_tokens, "rounds": args.rounds}  # fmt: skip
    return common.save_results(args.output, "onnx_gpu", argv, machine=machine, settings=settings,
                               results={"batches": results, "files_mib": sizes})  # fmt: skip


if __name__ == "__main__":
    main()
