"""BLEU of a trained model's CTranslate2 or ONNX export, fp32 against int8: passes when int8 loses at most
`--max_drop`; docs/ctranslate2.md and docs/experiments/onnx-speed.md."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from benchmarks import common


def exported(runtime: str, model: Path, folder: Path, quantization: str, threads: int):
    """Export `model` for `runtime` into `folder`; return its `translate(texts, options) -> texts`."""
    if runtime == "onnx":
        from vanilla_transformer_ort import OrtTranslator

        common.export_onnx(model, folder, quantization)
        translator = OrtTranslator(folder, provider="cpu", intra_op_num_threads=threads)
        return lambda texts, options: translator.translate(texts, **options)
    from vanilla_transformer.export.ctranslate2_export import export_ctranslate2

    export_ctranslate2(model, folder, quantization=None if quantization == "fp32" else "int8", force=True)
    return common.ct2_translate(folder, threads)


def main(argv: list[str] | None = None) -> dict:
    parser = common.parser(__doc__, None)
    parser.add_argument("--runtime", choices=["ctranslate2", "onnx"], default="ctranslate2")
    parser.add_argument("--model", type=Path, required=True, help="trained save_pretrained folder with tokenizer.json")
    parser.add_argument("--eval_tsv", type=Path, required=True, help="source<TAB>reference file with a header line")
    parser.add_argument("--eval_limit", type=int, default=None, help="first N rows only")
    parser.add_argument("--workdir", type=Path, default=None, help="where the exports go (default: a temp dir)")
    parser.add_argument("--num_beams", type=int, default=None, help="default: generation_config.json's, else 4")
    parser.add_argument("--length_penalty", type=float, default=None, help="default: generation_config.json's, else 1")
    parser.add_argument("--max_new_tokens", type=int, default=None, help="default: generation_config.json's, else 256")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_drop", type=float, default=0.5, help="int8 may lose at most this much BLEU")
    parser.add_argument("--compare_generate", action="store_true", help="count fp32 outputs equal to generate()'s")
    args = parser.parse_args(argv)

    import sacrebleu

    from vanilla_transformer.inference import load_translation_model
    from vanilla_transformer.inference import translate as generate

    config_file = args.model / "generation_config.json"
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    defaults = {"num_beams": 4, "length_penalty": 1.0, "max_new_tokens": 256}
    options = {key: next(v for v in (getattr(args, key), config.get(key), default) if v is not None)
               for key, default in defaults.items()}  # fmt: skip
    sources, references = common.read_tsv(args.eval_tsv, args.eval_limit)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="int8-bleu-"))
    results, outputs = {"bleu": {}, "seconds": {}}, {}
    for name in ("fp32", "int8"):
        translate = exported(args.runtime, args.model, work / f"{args.runtime}-{name}", name, args.threads)
        start, size = time.perf_counter(), args.batch_size
        outputs[name] = [
            text for i in range(0, len(sources), size) for text in translate(sources[i : i + size], options)
        ]
        results["seconds"][name] = time.perf_counter() - start
        results["bleu"][name] = sacrebleu.corpus_bleu(outputs[name], [references]).score
        print(f"BLEU {name} {results['bleu'][name]:6.2f} ({len(sources)} sentences, {results['seconds'][name]:.1f} s)")
    results["int8_drop"] = drop = results["bleu"]["fp32"] - results["bleu"]["int8"]
    results["passed"] = drop <= args.max_drop
    verdict = "within" if results["passed"] else "NOT within"
    print(f"int8 - fp32 = {-drop:+.2f} BLEU: {verdict} {args.max_drop} of fp32")
    if args.compare_generate:  # max_length counts the decoder start token, hence + 1
        model, tokenizer = load_translation_model(args.model, device="cpu")
        reference = generate(model, tokenizer, sources, batch_size=args.batch_size, num_beams=options["num_beams"],
                             length_penalty=options["length_penalty"], max_length=options["max_new_tokens"] + 1,
                             show_progress=False)  # fmt: skip
        same = sum(a.strip() == b.strip() for a, b in zip(outputs["fp32"], reference, strict=True))
        results["identical_to_generate"] = same
        print(f"fp32 translations identical to generate(): {same} of {len(sources)}")
    settings = {"runtime": args.runtime, "model": args.model, "eval_tsv": args.eval_tsv, "sentences": len(sources),
                **options}  # fmt: skip
    output = args.output or ("onnx_bleu" if args.runtime == "onnx" else "ctranslate2_bleu")
    return common.save_results(output, "quality.int8_bleu", argv, machine=common.machine_info(args.threads),
                               settings=settings, results=results)  # fmt: skip


if __name__ == "__main__":
    main()
