"""Generation speed of an OPUS-MT-shaped model: transformers' MarianMTModel against the same weights imported into this
package (`vanilla_transformer.convert.from_marian`) and run in PyTorch, onnxruntime (fp32, int8) and this package's
CTranslate2 export (fp32, int8); CTranslate2's own Marian converter is run too, as the reference CTranslate2 path.

    python -m benchmarks.opus_mt_speed --rounds 3

The model has OPUS-MT's shape with random weights, built locally (no download): d_model 512, 6+6 layers, 8 heads,
FFN 2048, a shared 58,101-token vocabulary, swish, √d_model embedding scale, a random `final_logits_bias`, pad (the
last id) as decoder start, EOS 0. Workload and timing as `benchmarks.generate_speed`: the same random 24-token sources,
exactly 32 new tokens, greedy and beam 4 at batch 1 and 16, systems interleaved round after round.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks import common
from benchmarks.generate_speed import (
    NEW_TOKENS,
    ROWS,
    SOURCE_LEN,
    ct2_generate,
    hf_generate,
    ort_generate,
    source_ids,
    token_agreement,
)

OPUS_VOCAB_SIZE = 58_101
OPUS = common.Dims(vocab_size=OPUS_VOCAB_SIZE)
REFERENCE = "transformers Marian"


def opus_marian_config():
    """Marian's config of an OPUS-MT en-de checkpoint: base dimensions, a 58,101-word vocabulary, swish."""
    return common.marian_config(OPUS, activation_function="swish")


def prepare(workdir: Path, log=print) -> dict[str, Path]:
    """Save the random OPUS-MT-shaped Marian and (when `from_marian` is available) its import into this package, with
    a word-level tokenizer and Marian's vocab.json; export both to CTranslate2 and the import to ONNX. Idempotent."""
    import torch
    from transformers import MarianMTModel

    workdir.mkdir(parents=True, exist_ok=True)
    paths = {"marian": workdir / "opus-marian", "vanilla": workdir / "opus-vanilla"}
    vocab = common.marian_vocabulary(OPUS_VOCAB_SIZE)
    if not (paths["marian"] / "config.json").exists():
        log(f"saving an OPUS-MT-shaped Marian to {paths['marian']}")
        torch.manual_seed(common.SEED)
        marian = MarianMTModel(opus_marian_config())
        with torch.no_grad():
            marian.final_logits_bias.normal_(0.0, 1.0)  # trained OPUS-MT checkpoints hold a non-zero bias
        marian.save_pretrained(paths["marian"])
        common.build_word_tokenizer(vocab).save_pretrained(paths["marian"])
    for quantization in ("fp32", "int8"):
        paths[f"ct2-{quantization}"] = out = workdir / f"opus-marian-ct2-{quantization}"
        if not (out / "model.bin").exists():
            log(f"converting the Marian with CTranslate2's own converter ({quantization})")
            common.convert_ct2(paths["marian"], out, quantization)
    try:
        from vanilla_transformer.convert import from_marian
    except ImportError:
        log("vanilla_transformer.convert.from_marian is not available: only the Marian columns run")
        return paths
    if not (paths["vanilla"] / "config.json").exists():
        log(f"importing it into vanilla-transformer in {paths['vanilla']}")
        from_marian(MarianMTModel.from_pretrained(paths["marian"])).save_pretrained(paths["vanilla"])
        common.build_word_tokenizer(vocab).save_pretrained(paths["vanilla"])
        (paths["vanilla"] / "vocab.json").write_text(json.dumps({token: i for i, token in enumerate(vocab)}))
    for quantization in ("fp32", "int8"):
        paths[f"vanilla-ct2-{quantization}"] = common.vanilla_ct2(paths["vanilla"], quantization)
        if common.onnx_available():
            paths[f"onnx-{quantization}"] = out = workdir / f"opus-vanilla-onnx-{quantization}"
            if not (out / "manifest.json").exists():
                log(f"exporting the import to ONNX ({quantization})")
                common.export_onnx(paths["vanilla"], out, quantization)
    return paths


def load_systems(paths: dict[str, Path], threads: int, only: list[str] | None = None) -> dict:
    from transformers import MarianMTModel

    from vanilla_transformer import VanillaTransformerForConditionalGeneration

    vocab = common.marian_vocabulary(OPUS_VOCAB_SIZE)
    loaders = {
        REFERENCE: lambda: hf_generate(MarianMTModel.from_pretrained(paths["marian"]).eval()),
        "CTranslate2 fp32": lambda: ct2_generate(paths["ct2-fp32"], threads, vocab),
        "CTranslate2 int8": lambda: ct2_generate(paths["ct2-int8"], threads, vocab),
    }
    if "vanilla-ct2-fp32" in paths:
        loaders["vanilla PyTorch"] = lambda: hf_generate(
            VanillaTransformerForConditionalGeneration.from_pretrained(paths["vanilla"]).eval()
        )
        loaders["vanilla CT2 fp32"] = lambda: ct2_generate(paths["vanilla-ct2-fp32"], threads, vocab)
        loaders["vanilla CT2 int8"] = lambda: ct2_generate(paths["vanilla-ct2-int8"], threads, vocab)
    if "onnx-fp32" in paths:
        loaders["vanilla ORT fp32"] = lambda: ort_generate(paths["onnx-fp32"], threads)
        loaders["vanilla ORT int8"] = lambda: ort_generate(paths["onnx-int8"], threads)
    names = [name for name in loaders if only is None or name in only or name == REFERENCE]
    return {name: loaders[name]() for name in names}


def main(argv: list[str] | None = None) -> dict:
    parser = common.generation_arguments(__doc__, rounds=5, name="opus_mt_speed")
    parser.add_argument("--rows", nargs="*", choices=list(ROWS), default=list(ROWS))
    args = parser.parse_args(argv)

    common.pin_threads(args.threads)
    log = (lambda _msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    paths = prepare(args.workdir, log=log)
    systems = load_systems(paths, args.threads, args.systems)

    results: dict[str, dict] = {}
    for row in args.rows:
        num_beams, batch = ROWS[row]
        ids = source_ids(batch)
        outputs = {name: generate(ids, num_beams) for name, generate in systems.items()}
        for name, tokens in outputs.items():  # identical work: exactly NEW_TOKENS new tokens per row, everywhere
            if {len(row_tokens) for row_tokens in tokens} != {NEW_TOKENS}:
                raise RuntimeError(f"{name} did not produce exactly {NEW_TOKENS} new tokens per row on {row!r}")
        log(f"{row}:")
        times = common.run_interleaved(
            {name: (lambda g=g, i=ids, k=num_beams: g(i, k)) for name, g in systems.items()},
            rounds=args.rounds,
            warmup=args.warmup,
            log=log,
        )
        stats = {name: common.summarize(t) for name, t in times.items()}
        for name, s in stats.items():
            s["speedup_vs_marian"] = common.speedup(stats[REFERENCE]["median"], s["median"])
            s["times"] = times[name]
            s["tokens_equal_to_marian"] = token_agreement(outputs[name], outputs[REFERENCE])
        results[row] = stats

    names = list(systems)
    table = common.format_table(
        ["workload", *names],
        [
            [row]
            + [f"{s[n]['speedup_vs_marian']:.2f}x ({s[n]['median']:.3f} s, min {s[n]['min']:.3f})" for n in names]
            for row, s in results.items()
        ],
    )
    noise = common.noise_line({f"{row}/{n}": s for row, stats in results.items() for n, s in stats.items()})
    print(table)
    print(f"\nratio = Marian's median / the system's median (>1 = faster); {args.rounds} interleaved rounds")
    for row, stats in results.items():
        shares = ", ".join(f"{n} {s['tokens_equal_to_marian']:.0%}" for n, s in stats.items() if n != REFERENCE)
        print(f"tokens equal to Marian, {row}: {shares}")
    print(noise)
    return common.save_results(
        args.name,
        "opus_mt_speed",
        argv,
        machine=common.machine_info(args.threads),
        settings={
            "vocab_size": OPUS_VOCAB_SIZE,
            "source_len": SOURCE_LEN,
            "new_tokens": NEW_TOKENS,
            "rounds": args.rounds,
            "warmup": args.warmup,
        },
        results=results,
        noise=noise,
        table=table,
    )


if __name__ == "__main__":
    main()
