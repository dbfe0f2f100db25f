"""BLEU of a trained model folder through its CTranslate2 export, fp32 against int8 (the cost of int8 weights).

    python -m benchmarks.ctranslate2_bleu --model runs/demo --eval-tsv ../shared/data/gettext-en-de/test.tsv

Exports the folder with `vanilla_transformer.export.ctranslate2_export` (float32 and int8 weights, into `--work-dir`),
translates the TSV's first column with each (beam and length penalty from the model's generation_config.json, as
`generate()` would use them, unless given), and scores the second column with sacreBLEU. Passes when int8 is within
`--max-drop` BLEU (default 0.5) of fp32. `--compare-generate` also translates with the model's own `generate()`
(same beam, length penalty and length limit) and reports how many fp32 translations are identical to it. Results go to
`benchmarks/results/ctranslate2_bleu.json`.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from benchmarks import common

VARIANTS = {"fp32": None, "int8": "int8"}


def read_tsv(path: Path, limit: int | None) -> tuple[list[str], list[str]]:
    """source<TAB>reference rows after a header line."""
    rows = [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()[1:] if line.strip()]
    rows = rows[:limit] if limit else rows
    return [row[0] for row in rows], [row[1] for row in rows]


def generation_defaults(model_dir: Path) -> dict:
    path = model_dir / "generation_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    return {
        "num_beams": config.get("num_beams", 4),
        "length_penalty": config.get("length_penalty", 1.0),
        "max_new_tokens": config.get("max_new_tokens") or 256,
    }


def translate(folder: Path, sources: list[str], options: dict, threads: int, batch_size: int) -> list[str]:
    """Tokenize with the export's tokenizer.json, translate with CTranslate2, detokenize without special tokens."""
    import ctranslate2
    from tokenizers import Tokenizer

    from vanilla_transformer.export.ctranslate2_export import generation_options

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    translator = ctranslate2.Translator(str(folder), device="cpu", intra_threads=threads)
    hypotheses = []
    for start in range(0, len(sources), batch_size):
        batch = [encoding.tokens for encoding in tokenizer.encode_batch(sources[start : start + batch_size])]
        results = translator.translate_batch(batch, **generation_options(**options))
        for result in results:
            ids = [tokenizer.token_to_id(token) for token in result.hypotheses[0]]
            hypotheses.append(tokenizer.decode([i for i in ids if i is not None], skip_special_tokens=True))
    return hypotheses


def generate_texts(model_dir: Path, sources: list[str], options: dict, batch_size: int) -> list[str]:
    """The same sources through PyTorch `generate()`: max_length counts the decoder start token, hence + 1."""
    from vanilla_transformer.inference import load_translation_model, translate

    model, tokenizer = load_translation_model(model_dir, device="cpu")
    return translate(
        model, tokenizer, sources, batch_size=batch_size, num_beams=options["num_beams"],
        length_penalty=options["length_penalty"], max_length=options["max_new_tokens"] + 1, show_progress=False,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="trained save_pretrained folder with tokenizer.json")
    parser.add_argument("--eval-tsv", type=Path, required=True, help="source<TAB>reference file with a header line")
    parser.add_argument("--eval-limit", type=int, default=None, help="first N rows only")
    parser.add_argument("--work-dir", type=Path, default=None, help="where the exports go (default: a temp dir)")
    parser.add_argument("--num-beams", type=int, default=None)
    parser.add_argument("--length-penalty", type=float, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=common.THREADS)
    parser.add_argument("--max-drop", type=float, default=0.5, help="int8 may lose at most this much BLEU")
    parser.add_argument("--compare-generate", action="store_true", help="count fp32 outputs equal to generate()'s")
    parser.add_argument("--name", default="ctranslate2_bleu", help="results file name under benchmarks/results/")
    args = parser.parse_args(argv)

    import sacrebleu

    from vanilla_transformer.export.ctranslate2_export import export_ctranslate2

    options = generation_defaults(args.model)
    for key in options:
        if getattr(args, key) is not None:
            options[key] = getattr(args, key)
    sources, references = read_tsv(args.eval_tsv, args.eval_limit)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="ct2-bleu-"))
    scores, seconds, outputs = {}, {}, {}
    for name, quantization in VARIANTS.items():
        folder = export_ctranslate2(args.model, work / name, quantization=quantization, force=True)
        start = time.perf_counter()
        hypotheses = outputs[name] = translate(folder, sources, options, args.threads, args.batch_size)
        seconds[name] = time.perf_counter() - start
        scores[name] = sacrebleu.corpus_bleu(hypotheses, [references]).score
        print(f"BLEU {name:5s} {scores[name]:6.2f}  ({len(sources)} sentences, {seconds[name]:.1f} s, {options})")
    drop = scores["fp32"] - scores["int8"]
    passed = drop <= args.max_drop
    print(f"int8 - fp32 = {-drop:+.2f} BLEU: {'within' if passed else 'NOT within'} {args.max_drop} of fp32")
    identical = None
    if args.compare_generate:
        reference = generate_texts(args.model, sources, options, args.batch_size)
        identical = sum(a.strip() == b.strip() for a, b in zip(outputs["fp32"], reference, strict=True))
        print(f"fp32 translations identical to generate(): {identical} of {len(sources)}")
    return common.save_results(
        args.name,
        "ctranslate2_bleu",
        argv,
        machine=common.machine_info(args.threads),
        settings={"model": str(args.model), "eval_tsv": str(args.eval_tsv), "sentences": len(sources), **options},
        bleu=scores,
        seconds=seconds,
        int8_drop=drop,
        passed=passed,
        identical_to_generate=identical,
    )


if __name__ == "__main__":
    main()
