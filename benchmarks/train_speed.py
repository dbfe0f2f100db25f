"""Training throughput, side by side with transformers' Marian, and against the machine's own fp32 matmul peak.

One step = forward with labels (teacher forcing, dropout on), backward, AdamW. Target tokens per second and FLOP
utilisation (the step's matmul FLOPs per second / the best sgemm rate measured in the same run, interleaved with the
steps, so both see the same machine).

    python -m benchmarks.train_speed --rounds 5
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from benchmarks import common

SEQ_LEN = 32
BATCHES = (64, 128)
REFERENCE = "transformers Marian"
SGEMM = "sgemm 2048 (fp32 peak)"
SGEMM_N = 2048


def make_batch(batch: int, seed: int = common.SEED):
    """Random source and target ids (both vocabularies treat 3 .. vocab-10 as ordinary words), no padding."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    source = torch.randint(3, common.VOCAB_SIZE - 10, (batch, SEQ_LEN), generator=gen)
    labels = torch.randint(3, common.VOCAB_SIZE - 10, (batch, SEQ_LEN), generator=gen)
    return source, torch.ones_like(source), labels


def make_step(
    model, batch: int, optimizer: str, compile_model: bool = False, bf16: bool = False
) -> Callable[[], float]:
    """One training step on a fixed batch; returns the loss (a host sync, as a training loop's logging does). `bf16`:
    the forward under CPU bf16 autocast, as `--bf16 --use_cpu` runs it (fp32 weights and optimizer)."""
    import contextlib

    import torch

    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, **({"fused": True} if optimizer == "fused" else {"foreach": True}))
    forward = torch.compile(model) if compile_model else model
    source, mask, labels = make_batch(batch)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            loss = forward(input_ids=source, attention_mask=mask, labels=labels).loss
        loss.backward()
        opt.step()
        return loss.item()

    return step


def build_systems(batch: int, optimizer: str, variants: list[str]) -> dict[str, Callable[[], float]]:
    systems = {REFERENCE: make_step(common.build_marian(), batch, optimizer)}
    if "eager" in variants:
        systems["vanilla PyTorch"] = make_step(common.build_vanilla(), batch, optimizer)
    if "fused-off" in variants:
        model = common.build_vanilla()
        model.config.fused_output_loss = False  # lm_head's logits, then the chunked loss on them
        systems["vanilla (fused loss off)"] = make_step(model, batch, optimizer)
    if "compile" in variants:
        systems["vanilla torch.compile"] = make_step(common.build_vanilla(), batch, optimizer, compile_model=True)
    if "eager-attn" in variants:
        model = common.build_vanilla()
        model.set_attn_implementation("eager")
        systems["vanilla eager attention"] = make_step(model, batch, optimizer)
    if "bf16" in variants:
        systems["vanilla bf16 autocast"] = make_step(common.build_vanilla(), batch, optimizer, bf16=True)
    if "marian-bf16" in variants:
        systems["Marian bf16 autocast"] = make_step(common.build_marian(), batch, optimizer, bf16=True)
    if "marian-compile" in variants:
        systems["Marian torch.compile"] = make_step(common.build_marian(), batch, optimizer, compile_model=True)
    return systems


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first (compilation happens here)")
    parser.add_argument("--threads", type=int, default=common.THREADS)
    parser.add_argument("--batches", type=int, nargs="*", default=list(BATCHES))
    parser.add_argument("--optimizer", choices=["fused", "foreach"], default="fused", help="AdamW, same for all")
    parser.add_argument(
        "--variants",
        nargs="*",
        default=["eager", "compile"],
        choices=["eager", "compile", "eager-attn", "bf16", "marian-compile", "marian-bf16", "fused-off"],
        help="which of this package's variants to run next to eager Marian",
    )
    parser.add_argument("--name", default="train_speed", help="results file name under benchmarks/results/")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)

    common.pin_threads(args.threads)
    log = (lambda _msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    machine = common.machine_info(args.threads)

    results: dict[str, dict] = {}
    for batch in args.batches:
        log(f"batch {batch}x{SEQ_LEN}:")
        sgemm_rates: list[float] = []  # GFLOP/s of the best matmul in each interleaved sgemm call
        systems: dict[str, Callable[[], object]] = {
            SGEMM: lambda rates=sgemm_rates: rates.append(common.sgemm_gflops(common.sgemm_seconds(SGEMM_N), SGEMM_N)),
            **build_systems(batch, args.optimizer, args.variants),
        }
        times = common.run_interleaved(systems, rounds=args.rounds, warmup=args.warmup, log=log)
        flops = common.training_step_flops(common.BASE, batch, SEQ_LEN, SEQ_LEN)
        stats = {name: common.summarize(t) for name, t in times.items() if name != SGEMM}
        reference = stats[REFERENCE]["median"]
        for name, s in stats.items():
            s["target_tokens_per_s"] = batch * SEQ_LEN / s["median"]
            s["target_tokens_per_s_best"] = batch * SEQ_LEN / s["min"]
            s["gflops"] = flops / s["median"] / 1e9
            s["speedup_vs_marian"] = common.speedup(reference, s["median"])
            s["times"] = times[name]
        results[f"{batch}x{SEQ_LEN}"] = {"step_flops": flops, "sgemm_gflops": sgemm_rates, "systems": stats}

    # The peak: the best sgemm rate seen anywhere in the run (the limit this machine showed for fp32 matmuls).
    peak = max(max(r["sgemm_gflops"]) for r in results.values())
    headers = ["batch", "system", "target tok/s (median)", "best", "GFLOP/s", "of sgemm peak", "vs Marian"]
    rows = []
    for key, r in results.items():
        for name, s in r["systems"].items():
            s["utilisation"] = s["gflops"] / peak
            rows.append(
                [
                    key,
                    name,
                    f"{s['target_tokens_per_s']:.0f}",
                    f"{s['target_tokens_per_s_best']:.0f}",
                    f"{s['gflops']:.1f}",
                    f"{s['utilisation']:.0%}",
                    f"{s['speedup_vs_marian']:.2f}x",
                ]
            )
    table = common.format_table(headers, rows)
    noise = common.noise_line({f"{k}/{n}": s for k, r in results.items() for n, s in r["systems"].items()})
    print(table)
    print(f"\nsgemm peak {peak:.1f} GFLOP/s (fp32 torch.mm {SGEMM_N}^3, best in this run, {args.threads} threads)")
    print(f"step FLOPs: 3 x forward matmul FLOPs; AdamW {args.optimizer} for every system; {args.rounds} rounds")
    print(noise)
    return common.save_results(
        args.name,
        "train_speed",
        argv,
        machine=machine,
        settings=vars(args) | {"seq_len": SEQ_LEN},
        sgemm_peak_gflops=peak,
        results=results,
        noise=noise,
        table=table,
    )


if __name__ == "__main__":
    main()
