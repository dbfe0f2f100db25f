"""Training throughput (forward, backward, fused AdamW at the base size) beside transformers' Marian and as a share of
the machine's fp32 matmul peak; docs/benchmarks.md, runs in docs/experiments/speed-log.md."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from benchmarks import common

SEQ_LEN = 32
REFERENCE = "transformers Marian"
VARIANTS = {  # --variants name -> (system, builder, torch.compile, bf16 autocast)
    "eager": ("vanilla PyTorch", common.build_vanilla, False, False),
    "compile": ("vanilla torch.compile", common.build_vanilla, True, False),
    "bf16": ("vanilla bf16 autocast", common.build_vanilla, False, True),
    "marian-bf16": ("Marian bf16 autocast", common.build_marian, False, True),
}


def make_step(model, batch: int, compile_model: bool = False, bf16: bool = False) -> Callable[[], float]:
    """One training step on a fixed batch of random ids (3 .. vocab-10 are ordinary words in both vocabularies, no
    padding); returns the loss (a host sync, as a training loop's logging does)."""
    import torch

    gen = torch.Generator().manual_seed(common.SEED)
    source, labels = (torch.randint(3, common.VOCAB_SIZE - 10, (batch, SEQ_LEN), generator=gen) for _ in range(2))
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    forward = torch.compile(model) if compile_model else model

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            loss = forward(input_ids=source, attention_mask=torch.ones_like(source), labels=labels).loss
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


def main(argv: list[str] | None = None) -> dict:
    parser = common.parser(__doc__, "train_speed", rounds=5)
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first (compilation happens here)")
    parser.add_argument("--batches", type=int, nargs="*", default=[64, 128], help="sentences per batch")
    parser.add_argument("--variants", nargs="*", default=["eager", "compile"], choices=list(VARIANTS),
                        help="which variants to run next to eager Marian")  # fmt: skip
    args = parser.parse_args(argv)
    common.pin_threads(args.threads)

    results: dict[str, dict] = {}
    for batch in args.batches:
        common.log(f"batch {batch}x{SEQ_LEN}:")
        systems = common.sgemm_systems(args.threads) | {REFERENCE: make_step(common.build_marian(), batch)}
        for variant in args.variants:
            name, build, compile_model, bf16 = VARIANTS[variant]
            systems[name] = make_step(build(), batch, compile_model, bf16)
        times = common.run_interleaved(systems, rounds=args.rounds, warmup=args.warmup, log=common.log)
        flops = common.training_step_flops(common.BASE, batch, SEQ_LEN, SEQ_LEN)
        stats = {name: common.summarize(t) | {"times": t} for name, t in times.items() if name != "sgemm torch"}
        for s in stats.values():
            s["target_tokens_per_s"] = batch * SEQ_LEN / s["median"]
            s["target_tokens_per_s_best"] = batch * SEQ_LEN / s["min"]
            s["gflops"] = flops / s["median"] / 1e9
            s["speedup_vs_marian"] = stats[REFERENCE]["median"] / s["median"]
        sgemm = [common.sgemm_gflops(seconds) for seconds in times["sgemm torch"]]
        results[f"{batch}x{SEQ_LEN}"] = {"step_flops": flops, "sgemm_gflops": sgemm, "systems": stats}

    # The peak: the best sgemm rate seen anywhere in the run (the limit this machine showed for fp32 matmuls).
    peak = max(max(r["sgemm_gflops"]) for r in results.values())
    rows = []
    for key, r in results.items():
        for name, s in r["systems"].items():
            s["utilisation"] = s["gflops"] / peak
            cells = f"{s['target_tokens_per_s']:.0f}", f"{s['target_tokens_per_s_best']:.0f}", f"{s['gflops']:.1f}"
            rows.append([key, name, *cells, f"{s['utilisation']:.0%}", f"{s['speedup_vs_marian']:.2f}x"])
    headers = ["batch", "system", "target tok/s (median)", "best", "GFLOP/s", "of sgemm peak", "vs Marian"]
    print(common.format_table(headers, rows))
    print(f"\nsgemm peak {peak:.1f} GFLOP/s (fp32 torch.mm 2048^3, best in this run, {args.threads} threads)")
    print(f"step FLOPs: 3 x forward matmul FLOPs; fused AdamW for every system; {args.rounds} rounds")
    print(common.noise_line({f"{k}/{n}": s for k, r in results.items() for n, s in r["systems"].items()}))
    return common.save_results(args.output, "train_speed", argv, machine=common.machine_info(args.threads),
                               settings=vars(args) | {"seq_len": SEQ_LEN},
                               results={"sgemm_peak_gflops": peak, "batches": results})  # fmt: skip


if __name__ == "__main__":
    main()
