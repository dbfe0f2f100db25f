"""Generation speed, side by side: transformers' Marian, this package (PyTorch, onnxruntime and its own CTranslate2
export), CTranslate2 running the Marian model.

Every system translates the same random 24-token sources into exactly 32 new tokens (EOS is masked until then), with
greedy search and beam 4, at batch 1 and 16; one more row decodes 128 new tokens (greedy, batch 1), where a decoder
that copies its cache every step pays most. Systems are timed interleaved, round after round, on pinned threads.

    python -m benchmarks.generate_speed --rounds 7
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks import common

SOURCE_LEN = 24
NEW_TOKENS = 32
ROWS = {  # name -> (num_beams, batch)
    "greedy, batch 1": (1, 1),
    "greedy, batch 16": (1, 16),
    "beam 4, batch 1": (4, 1),
    "beam 4, batch 16": (4, 16),
}
# Rows with another output length: name -> (num_beams, batch, new tokens).
LONG_ROWS = {"greedy, batch 1, 128 new tokens": (1, 1, 128)}
REFERENCE = "transformers Marian"
# Reported ratios of the field (issue 6), for the README's comparison; measured before this package existed.
FIELD = {
    "greedy, batch 1": {"CTranslate2 fp32": 2.47, "CTranslate2 int8": 2.32},
    "greedy, batch 16": {"CTranslate2 fp32": 0.93, "CTranslate2 int8": 2.38},
    "beam 4, batch 1": {"CTranslate2 fp32": 3.08, "CTranslate2 int8": 2.22},
    "beam 4, batch 16": {"CTranslate2 fp32": 1.27, "CTranslate2 int8": 2.59},
}

# (source ids (batch, len), num_beams[, new tokens]) -> new tokens per row
Generate = Callable[..., list[list[int]]]


def source_ids(batch: int, seed: int = common.SEED) -> np.ndarray:
    """The same random sources for every system: ids that are ordinary words in both vocabularies."""
    rng = np.random.default_rng(seed)
    return rng.integers(3, common.VOCAB_SIZE - 10, size=(batch, SOURCE_LEN), dtype=np.int64)


def token_agreement(tokens: list[list[int]], reference: list[list[int]]) -> float:
    """Share of positions where two systems chose the same token (1.0 = identical outputs)."""
    pairs = [(a, b) for row, ref in zip(tokens, reference, strict=True) for a, b in zip(row, ref, strict=True)]
    return sum(a == b for a, b in pairs) / len(pairs)


def hf_generate(model) -> Generate:
    import torch

    def run(ids: np.ndarray, num_beams: int, new_tokens: int = NEW_TOKENS) -> list[list[int]]:
        input_ids = torch.from_numpy(ids)
        out = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            num_beams=num_beams,
            do_sample=False,
            min_new_tokens=new_tokens,
            max_new_tokens=new_tokens,
            forced_eos_token_id=None,
            length_penalty=1.0,
        )
        return out[:, 1:].tolist()  # drop the decoder start token

    return run


def with_packed_min_rows(generate: Generate, min_rows: int | None) -> Generate:
    """`generate` with `kernels.PACKED_MIN_ROWS` set for its calls (None: packing off), restored after each call."""
    from vanilla_transformer.model import kernels

    def run(*args, **kwargs) -> list[list[int]]:
        saved = kernels.PACKED_MIN_ROWS
        kernels.PACKED_MIN_ROWS = min_rows if min_rows is not None else sys.maxsize
        try:
            return generate(*args, **kwargs)
        finally:
            kernels.PACKED_MIN_ROWS = saved

    return run


def ct2_generate(path: Path, threads: int, vocab: list[str] | None = None) -> Generate:
    """CTranslate2 on token strings: `vocab` maps ids to them (default: the Marian peer's vocabulary)."""
    import ctranslate2

    translator = ctranslate2.Translator(str(path), device="cpu", intra_threads=threads, inter_threads=1)
    vocab = vocab or common.marian_vocabulary()
    index = {tok: i for i, tok in enumerate(vocab)}

    def run(ids: np.ndarray, num_beams: int, new_tokens: int = NEW_TOKENS) -> list[list[int]]:
        source = [[vocab[i] for i in row] for row in ids.tolist()]
        results = translator.translate_batch(
            source,
            beam_size=num_beams,
            min_decoding_length=new_tokens,
            max_decoding_length=new_tokens,
            length_penalty=1.0,
        )
        return [[index[tok] for tok in r.hypotheses[0]] for r in results]

    return run


def ort_generate(path: Path, threads: int, decoder_cache: str = "auto") -> Generate:
    """The runtime on `path`; `decoder_cache="copy"` runs the decoder graph that copies its cache every step."""
    from vanilla_transformer_ort import OrtTranslator

    # onnxruntime's own thread pool spins like OpenMP's ACTIVE policy; follow the policy the other systems run with.
    spinning = "0" if os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE" else "1"
    translator = OrtTranslator(
        path,
        provider="cpu",
        intra_op_num_threads=threads,
        session_config={"session.intra_op.allow_spinning": spinning},
        decoder_cache=decoder_cache,
    )

    def run(ids: np.ndarray, num_beams: int, new_tokens: int = NEW_TOKENS) -> list[list[int]]:
        out = translator.generate(
            ids,
            np.ones_like(ids),
            num_beams=num_beams,
            min_new_tokens=new_tokens,
            max_new_tokens=new_tokens,
            forced_eos_token_id=None,
            length_penalty=1.0,
        )
        return [list(row[1:]) for row in np.asarray(out).tolist()]

    return run


def load_systems(paths: dict[str, Path], threads: int, only: list[str] | None = None) -> dict[str, Generate]:
    from transformers import MarianMTModel

    from vanilla_transformer import VanillaTransformerForConditionalGeneration

    loaders: dict[str, Callable[[], Generate]] = {
        REFERENCE: lambda: hf_generate(MarianMTModel.from_pretrained(paths["marian"]).eval()),
        "vanilla PyTorch": lambda: hf_generate(
            VanillaTransformerForConditionalGeneration.from_pretrained(paths["vanilla"]).eval()
        ),
        "vanilla PyTorch eager-attn": lambda: hf_generate(
            VanillaTransformerForConditionalGeneration.from_pretrained(
                paths["vanilla"], attn_implementation="eager"
            ).eval()
        ),
        # the A/B of the packing threshold (kernels.PACKED_MIN_ROWS): packed at every row count, and never packed
        "vanilla PyTorch packed every row": lambda: with_packed_min_rows(
            hf_generate(VanillaTransformerForConditionalGeneration.from_pretrained(paths["vanilla"]).eval()), 1
        ),
        "vanilla PyTorch unpacked": lambda: with_packed_min_rows(
            hf_generate(VanillaTransformerForConditionalGeneration.from_pretrained(paths["vanilla"]).eval()), None
        ),
        "Marian eager-attn": lambda: hf_generate(
            MarianMTModel.from_pretrained(paths["marian"], attn_implementation="eager").eval()
        ),
        "CTranslate2 fp32": lambda: ct2_generate(paths["ct2-fp32"], threads),
        "CTranslate2 int8": lambda: ct2_generate(paths["ct2-int8"], threads),
        "vanilla CT2 fp32": lambda: ct2_generate(
            common.vanilla_ct2(paths["vanilla"], "fp32"), threads, common.vanilla_vocabulary()
        ),
        "vanilla CT2 int8": lambda: ct2_generate(
            common.vanilla_ct2(paths["vanilla"], "int8"), threads, common.vanilla_vocabulary()
        ),
    }
    if common.onnx_available():
        loaders["vanilla ORT fp32"] = lambda: ort_generate(paths["onnx-fp32"], threads)
        loaders["vanilla ORT int8"] = lambda: ort_generate(paths["onnx-int8"], threads)
        # the A/B of the in-place decoder: the same folders' copying decoder graph
        loaders["vanilla ORT fp32 copy"] = lambda: ort_generate(paths["onnx-fp32"], threads, "copy")
        loaders["vanilla ORT int8 copy"] = lambda: ort_generate(paths["onnx-int8"], threads, "copy")
        # the A/B of per-row activation quantization: one range per tensor
        loaders["vanilla ORT int8 per-tensor"] = lambda: ort_generate(common.int8_per_tensor_export(paths), threads)
        # the A/B of the per-row formulation: the previous one (asymmetric rows, offset added after each product)
        loaders["vanilla ORT int8 offset rows"] = lambda: ort_generate(common.int8_offset_rows_export(paths), threads)
    # attention-backend and decoder-cache comparisons, on request
    optional = ("vanilla PyTorch eager-attn", "Marian eager-attn", "vanilla PyTorch packed every row",
                "vanilla PyTorch unpacked", "vanilla ORT fp32 copy", "vanilla ORT int8 copy",
                "vanilla ORT int8 per-tensor", "vanilla ORT int8 offset rows")  # fmt: skip
    names = [n for n in loaders if (n in only if only is not None else n not in optional) or n == REFERENCE]
    return {name: loaders[name]() for name in names}


def main(argv: list[str] | None = None) -> dict:
    parser = common.generation_arguments(__doc__, rounds=7, name="generate_speed")
    all_rows = {**{name: (*shape, NEW_TOKENS) for name, shape in ROWS.items()}, **LONG_ROWS}
    parser.add_argument("--rows", nargs="*", choices=list(all_rows), default=list(all_rows))
    args = parser.parse_args(argv)

    common.pin_threads(args.threads)
    log = (lambda _msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    paths = common.prepare_artifacts(args.workdir, log=log)
    systems = load_systems(paths, args.threads, args.systems)
    machine = common.machine_info(args.threads)

    results: dict[str, dict] = {}
    for row in args.rows:
        num_beams, batch, new_tokens = all_rows[row]
        ids = source_ids(batch)
        outputs = {name: generate(ids, num_beams, new_tokens) for name, generate in systems.items()}
        for name, tokens in outputs.items():  # identical work: exactly new_tokens per row, everywhere
            lengths = {len(row_tokens) for row_tokens in tokens}
            if lengths != {new_tokens}:
                raise RuntimeError(f"{name} produced {lengths} new tokens on {row!r}, expected {new_tokens}")
        log(f"{row}:")
        times = common.run_interleaved(
            {name: (lambda g=g, i=ids, k=num_beams, n=new_tokens: g(i, k, n)) for name, g in systems.items()},
            rounds=args.rounds,
            warmup=args.warmup,
            log=log,
        )
        stats = {name: common.summarize(t) for name, t in times.items()}
        reference = stats[REFERENCE]["median"]
        for name, s in stats.items():
            s["speedup_vs_marian"] = common.speedup(reference, s["median"])
            s["times"] = times[name]
            if name.startswith("vanilla ") and name != "vanilla PyTorch" and "vanilla PyTorch" in outputs:
                s["tokens_equal_to_pytorch"] = token_agreement(outputs[name], outputs["vanilla PyTorch"])
        results[row] = stats

    names = list(systems)
    headers = ["workload", *names]
    rows = []
    for row, stats in results.items():
        rows.append(
            [row]
            + [
                f"{stats[n]['speedup_vs_marian']:.2f}x ({stats[n]['median']:.3f} s, min {stats[n]['min']:.3f})"
                for n in names
            ]
        )
    table = common.format_table(headers, rows)
    all_stats = {f"{row}/{n}": s for row, stats in results.items() for n, s in stats.items()}
    noise = common.noise_line(all_stats)
    print(table)
    print(f"\nratio = Marian's median / the system's median (>1 = faster); {args.rounds} interleaved rounds")
    for row, stats in results.items():
        agreement = {n: s["tokens_equal_to_pytorch"] for n, s in stats.items() if "tokens_equal_to_pytorch" in s}
        if agreement:
            shares = ", ".join(f"{n} {a:.0%}" for n, a in agreement.items())
            print(f"tokens equal to vanilla PyTorch, {row}: {shares}")
    print(noise)
    return common.save_results(
        args.name,
        "generate_speed",
        argv,
        machine=machine,
        settings={"source_len": SOURCE_LEN, "new_tokens": NEW_TOKENS, "rounds": args.rounds, "warmup": args.warmup},
        results=results,
        noise=noise,
        table=table,
    )


if __name__ == "__main__":
    main()
