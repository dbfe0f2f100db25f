"""Generation speed, interleaved, exactly as many new tokens each: transformers' Marian, this package (PyTorch,
onnxruntime, its own CTranslate2 export) and CTranslate2 on Marian; docs/benchmarks.md, runs in
docs/experiments/speed-log.md."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks import common

SOURCE_LEN, NEW_TOKENS = 24, 32
ROWS = {  # name -> (num_beams, batch, new tokens)
    "greedy, batch 1": (1, 1, NEW_TOKENS),
    "greedy, batch 16": (1, 16, NEW_TOKENS),
    "beam 4, batch 1": (4, 1, NEW_TOKENS),
    "beam 4, batch 16": (4, 16, NEW_TOKENS),
    "greedy, batch 1, 128 new tokens": (1, 1, 128),
}
REFERENCE = "transformers Marian"
Generate = Callable[[np.ndarray, int, int], list[list[int]]]  # (source ids, num_beams, new tokens) -> new tokens


def source_ids(batch: int, vocab_size: int = common.VOCAB_SIZE) -> np.ndarray:
    """The same random sources for every system: ids that are ordinary words in both vocabularies."""
    return np.random.default_rng(common.SEED).integers(3, vocab_size - 10, size=(batch, SOURCE_LEN), dtype=np.int64)


def token_agreement(tokens: list[list[int]], reference: list[list[int]]) -> float:
    """Share of positions where two systems chose the same token (1.0 = identical outputs)."""
    pairs = [(a, b) for row, ref in zip(tokens, reference, strict=True) for a, b in zip(row, ref, strict=True)]
    return sum(a == b for a, b in pairs) / len(pairs)


def hf_generate(model) -> Generate:
    """`generate()` of a transformers model (this package's or Marian), on the model's device."""
    import torch

    def run(ids: np.ndarray, num_beams: int, new_tokens: int) -> list[list[int]]:
        input_ids = torch.from_numpy(ids).to(model.device)
        out = model.generate(
            input_ids=input_ids, attention_mask=torch.ones_like(input_ids), num_beams=num_beams, do_sample=False,
            min_new_tokens=new_tokens, max_new_tokens=new_tokens, forced_eos_token_id=None, length_penalty=1.0,
        )  # fmt: skip
        return out[:, 1:].tolist()  # drop the decoder start token

    return run


def ct2_generate(path: Path, threads: int, vocab: list[str]) -> Generate:
    """CTranslate2 on token strings: `vocab` maps ids to them."""
    import ctranslate2

    translator = ctranslate2.Translator(str(path), device="cpu", intra_threads=threads, inter_threads=1)
    index = {tok: i for i, tok in enumerate(vocab)}

    def run(ids: np.ndarray, num_beams: int, new_tokens: int) -> list[list[int]]:
        source = [[vocab[i] for i in row] for row in ids.tolist()]
        results = translator.translate_batch(source, beam_size=num_beams, min_decoding_length=new_tokens,
                                             max_decoding_length=new_tokens, length_penalty=1.0)  # fmt: skip
        return [[index[tok] for tok in r.hypotheses[0]] for r in results]

    return run


def ort_generate(path: Path, threads: int, provider: str = "cpu", **options) -> Generate:
    """This package's runtime on an export folder (`options` go to `OrtTranslator`; it is `run.translator`)."""
    from vanilla_transformer_ort import OrtTranslator

    # onnxruntime's own thread pool spins like OpenMP's ACTIVE policy; follow the policy the other systems run with.
    spinning = "0" if os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE" else "1"
    config = {"session.intra_op.allow_spinning": spinning}
    translator = OrtTranslator(path, provider=provider, intra_op_num_threads=threads, session_config=config, **options)

    def run(ids: np.ndarray, num_beams: int, new_tokens: int) -> list[list[int]]:
        out = translator.generate(ids, np.ones_like(ids), num_beams=num_beams, min_new_tokens=new_tokens,
                                  max_new_tokens=new_tokens, forced_eos_token_id=None, length_penalty=1.0)  # fmt: skip
        return [list(row[1:]) for row in np.asarray(out).tolist()]

    run.translator = translator
    return run


def load_systems(
    paths: dict[str, Path], threads: int, dims: common.Dims, only: list[str] | None
) -> dict[str, Generate]:
    """Each system's `Generate`, Marian first; `only` picks a subset (Marian is always run)."""
    from transformers import MarianMTModel

    from vanilla_transformer import VanillaTransformerForConditionalGeneration as Vanilla

    marian_vocab = common.marian_vocabulary(dims.vocab_size)
    vanilla_vocab = marian_vocab if dims == common.OPUS_MT else common.vanilla_vocabulary()  # an import keeps Marian's
    loaders = {
        REFERENCE: lambda: hf_generate(MarianMTModel.from_pretrained(paths["marian"]).eval()),
        "vanilla PyTorch": lambda: hf_generate(Vanilla.from_pretrained(paths["vanilla"]).eval()),
        "CTranslate2 fp32": lambda: ct2_generate(paths["ct2-fp32"], threads, marian_vocab),
        "CTranslate2 int8": lambda: ct2_generate(paths["ct2-int8"], threads, marian_vocab),
        "vanilla CT2 fp32": lambda: ct2_generate(common.vanilla_ct2(paths["vanilla"], "fp32"), threads, vanilla_vocab),
        "vanilla CT2 int8": lambda: ct2_generate(common.vanilla_ct2(paths["vanilla"], "int8"), threads, vanilla_vocab),
        "vanilla ORT fp32": lambda: ort_generate(paths["onnx-fp32"], threads),
        "vanilla ORT int8": lambda: ort_generate(paths["onnx-int8"], threads),
    }
    return {name: load() for name, load in loaders.items() if only is None or name in only or name == REFERENCE}


def main(argv: list[str] | None = None) -> dict:
    parser = common.parser(__doc__, None, rounds=7)
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--shape", choices=["base", "opus-mt"], default="base", help="the models' dimensions")
    parser.add_argument("--rows", nargs="*", choices=list(ROWS), default=list(ROWS))
    parser.add_argument("--systems", nargs="*", default=None, help="subset of systems (Marian is always run)")
    parser.add_argument("--floor", action="store_true", help="time the fp32 matmul peak too: each row's floor")
    parser.add_argument("--workdir", type=Path, default=common.DEFAULT_WORKDIR, help="where the models are cached")
    args = parser.parse_args(argv)

    common.pin_threads(args.threads)
    opus = args.shape == "opus-mt"
    dims = common.OPUS_MT if opus else common.BASE
    paths = common.prepare_artifacts(args.workdir, dims)
    systems = load_systems(paths, args.threads, dims, args.systems)
    sgemm = common.sgemm_systems(args.threads, args.workdir) if args.floor else {}
    same_as = REFERENCE if opus else "vanilla PyTorch"  # the same weights: the same tokens
    results: dict[str, dict] = {}
    for row in args.rows:
        num_beams, batch, new_tokens = ROWS[row]
        ids = source_ids(batch)
        outputs = {name: generate(ids, num_beams, new_tokens) for name, generate in systems.items()}
        for name, tokens in outputs.items():  # identical work: exactly new_tokens per row, everywhere
            if {len(row_tokens) for row_tokens in tokens} != {new_tokens}:
                raise RuntimeError(f"{name} did not produce exactly {new_tokens} new tokens per row on {row!r}")
        common.log(f"{row}:")
        runs = {name: (lambda g=g, i=ids, k=num_beams, n=new_tokens: g(i, k, n)) for name, g in systems.items()}
        times = common.run_interleaved(runs | sgemm, rounds=args.rounds, warmup=args.warmup, log=common.log)
        results[row] = stats = {name: common.summarize(times[name]) | {"times": times[name]} for name in systems}
        for name, s in stats.items():
            s["speedup_vs_marian"] = stats[REFERENCE]["median"] / s["median"]
            if same_as in outputs and (opus or name.startswith("vanilla")):  # base: Marian has other weights
                s["same_tokens_as_" + same_as] = token_agreement(outputs[name], outputs[same_as])
        if sgemm:
            peak = max(common.sgemm_gflops(min(times[name])) for name in sgemm)
            flops = common.generation_matmul_flops(dims, batch, num_beams, SOURCE_LEN, new_tokens)
            results[row]["fp32 floor"] = {"seconds": flops / peak / 1e9, "gflop": flops / 1e9, "sgemm_gflops": peak}

    cell = "{speedup_vs_marian:.2f}x ({median:.3f} s, min {min:.3f})"
    table = [[row, *(cell.format(**stats[name]) for name in systems)] for row, stats in results.items()]
    print(common.format_table(["workload", *systems], table))
    print(f"\nratio = Marian's median / the system's median (>1 = faster); {args.rounds} interleaved rounds")
    for row, stats in results.items():
        key = "same_tokens_as_" + same_as
        shares = [f"{name} {s[key]:.0%}" for name, s in stats.items() if key in s]
        print(f"tokens equal to {same_as}'s, {row}: " + ", ".join(shares))
        if "fp32 floor" in stats:
            floor = stats["fp32 floor"]
            print("  fp32 floor {seconds:.3f} s: {gflop:.1f} GFLOP at {sgemm_gflops:.0f} GFLOP/s".format(**floor))
    print(common.noise_line({f"{row}/{n}": results[row][n] for row in results for n in systems}))
    output = args.output or ("opus_mt_speed" if opus else "generate_speed")
    return common.save_results(output, "generate_speed", argv, machine=common.machine_info(args.threads),
                               settings=vars(args) | {"source_len": SOURCE_LEN}, results=results)  # fmt: skip


if __name__ == "__main__":
    main()
