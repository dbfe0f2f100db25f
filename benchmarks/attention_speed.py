"""Attention in a `small` bf16 CPU training step: the package's path under CPU autocast (the eager formula in bf16,
fp32 softmax, for the `sdpa` and `eager` backends) against torch's flash attention fed fp32 (the path before) and
fed bf16 as it is; interleaved.

One step = forward with labels under bf16 autocast (as the main job trains on CPUs with native bf16), backward,
AdamW, at the main job's settings (`small` preset, vocabulary 8,000, ReLU dropout 0.3), over five batch shapes of
about 1,024 source and 1,024 target tokens (8 to 64 tokens long, a third of the rows with padded sources), as the
main job's token batches come; the time is the mean over the five shapes.

    python -m benchmarks.attention_speed --rounds 10
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator

from benchmarks import common

SHAPES = ((128, 8), (64, 16), (48, 21), (32, 32), (16, 64))  # (rows, tokens): about 1,024 tokens a side
PACKAGE = "bf16 formula (the package)"
FP32_FLASH = "flash attention fed fp32 (before)"
BF16_FLASH = "flash attention fed bf16"


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    """Run the attention as the package does, or without the bf16 formula (the sdpa backend, i.e. torch's CPU flash
    attention, fed fp32 with autocast off as before, or fed the bf16 tensors as they are)."""
    from vanilla_transformer.model import attention as attention_module
    from vanilla_transformer.model import kernels

    saved = attention_module.attention

    def fp32_backend(interface, module, query, key, value, mask, math=None, **kwargs):
        return kernels.attention(interface, module, query, key, value, mask, **kwargs)

    def as_it_is(interface, module, query, key, value, mask, math=None, **kwargs):
        return interface(module, query, key, value, mask, **kwargs)

    if name != PACKAGE:
        attention_module.attention = fp32_backend if name == FP32_FLASH else as_it_is
    try:
        yield
    finally:
        attention_module.attention = saved


def batches() -> list[tuple[object, object, object]]:
    import torch

    gen = torch.Generator().manual_seed(common.SEED)
    out = []
    for rows, length in SHAPES:
        source = torch.randint(4, 8000, (rows, length), generator=gen)
        labels = torch.randint(4, 8000, (rows, length), generator=gen)
        mask = torch.ones_like(source)
        mask[: rows // 3, length - length // 4 :] = 0  # a third of the rows: the last quarter is padding
        out.append((source, mask, labels))
    return out


def step_system(name: str) -> Callable[[], object]:
    import torch

    from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

    torch.manual_seed(common.SEED)
    config = VanillaTransformerConfig.from_preset("small", vocab_size=8000, activation_dropout=0.3)
    model = VanillaTransformerForConditionalGeneration(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    data = batches()

    def steps() -> float:
        total = 0.0
        with variant(name):
            for source, mask, labels in data:
                optimizer.zero_grad(set_to_none=True)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = model(input_ids=source, attention_mask=mask, labels=labels).loss
                loss.backward()
                optimizer.step()
                total += loss.item()
        return total

    return steps


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=common.THREADS)
    args = parser.parse_args(argv)
    common.pin_threads(args.threads)

    print(f"small training step, bf16 autocast, {len(SHAPES)} shapes of ~1,024 tokens, median of {args.rounds}:")
    systems = {name: step_system(name) for name in (PACKAGE, FP32_FLASH, BF16_FLASH)}
    times = common.run_interleaved(systems, rounds=args.rounds, warmup=2)
    results = {}
    for name, t in times.items():
        results[name] = common.summarize([seconds / len(SHAPES) for seconds in t])  # per step
    base = results[FP32_FLASH]["median"]
    for name, stats in results.items():
        change = 100 * (stats["median"] / base - 1)
        print(f"  {name:<36} {1000 * stats['median']:7.1f} ms a step ({change:+5.1f} %, cv {stats['cv']:.2f})")
    noise = common.noise_line(results)
    print(noise)
    return common.save_results(
        "attention_speed", "attention_speed", argv, machine=common.machine_info(args.threads), settings=vars(args),
        results=results, noise=noise,
    )  # fmt: skip


if __name__ == "__main__":
    main()
