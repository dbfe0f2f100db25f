"""Attention under CPU bf16 autocast: the package's path (the eager formula in bf16, fp32 softmax, for the `sdpa` and
`eager` backends up to `kernels.MATH_ATTENTION_MAX_KEYS` keys) against torch's flash attention fed fp32 (the path
before) and fed bf16 as it is; interleaved. First one attention's forward and backward by length (4,096 tokens, 4
heads of 64, the same for both paths whatever the gate), then whole training steps.

One step = forward with labels under bf16 autocast (as the main job trains on CPUs with native bf16), backward,
AdamW, at the main job's settings (`small` preset, vocabulary 8,000, ReLU dropout 0.3), over five batch shapes of
about 1,024 source and 1,024 target tokens (8 to 64 tokens long, a third of the rows with padded sources), as the
main job's token batches come; the time is the mean over the five shapes.

    python -m benchmarks.attention_speed --rounds 10
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterator

from benchmarks import common

LENGTHS = (16, 32, 64, 128, 256, 512)  # one attention: (4,096 / length) rows of this many queries and keys
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


def attention_systems(length: int) -> dict[str, Callable[[], object]]:
    """One self-attention's forward and backward on bf16 (rows, 4, length, 64) queries, keys and values with a third
    of the rows' last quarter padded: the bf16 formula against flash attention fed fp32, at any length."""
    import torch
    from torch import nn
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from vanilla_transformer.model.attention import eager_attention_forward

    gen = torch.Generator().manual_seed(common.SEED)
    rows = max(1, 4096 // length)
    inputs = [torch.randn(rows, 4, length, 64, generator=gen).bfloat16() for _ in range(3)]
    mask = torch.ones(rows, 1, 1, length, dtype=torch.bool)
    mask[: rows // 3, ..., length - length // 4 :] = False
    module = nn.Module().train()
    module.is_causal = False

    def run(formula: bool) -> Callable[[], object]:
        def once() -> None:
            q, k, v = (t.detach().requires_grad_() for t in inputs)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                if formula:  # the formula at every length, whatever the gate
                    output, _ = eager_attention_forward(module, q, k, v, mask, scaling=0.125)
                else:
                    output, _ = sdpa_attention_forward(module, q.float(), k.float(), v.float(), mask, scaling=0.125)
            output.float().sum().backward()

        return once

    return {PACKAGE: run(True), FP32_FLASH: run(False)}


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
    args = common.step_arguments(__doc__.splitlines()[0], 10, argv)

    results = {}
    print(f"one attention, forward and backward, 4,096 tokens, 4 heads of 64, median of {args.rounds}:")
    for length in LENGTHS:
        times = common.run_interleaved(attention_systems(length), rounds=args.rounds, warmup=2)
        line = []
        for name, t in times.items():
            results[f"attention {length}: {name}"] = common.summarize(t)
            line.append(f"{name} {1000 * statistics.median(t):7.2f} ms")
        print(f"  {length:>4} keys: " + ", ".join(line))

    print(f"small training step, bf16 autocast, {len(SHAPES)} shapes of ~1,024 tokens, median of {args.rounds}:")
    systems = {name: step_system(name) for name in (PACKAGE, FP32_FLASH, BF16_FLASH)}
    times = common.run_interleaved(systems, rounds=args.rounds, warmup=2)
    steps = {name: common.summarize([seconds / len(SHAPES) for seconds in t]) for name, t in times.items()}
    results.update({f"step: {name}": stats for name, stats in steps.items()})
    base = steps[FP32_FLASH]["median"]
    for name, stats in steps.items():
        change = 100 * (stats["median"] / base - 1)
        print(f"  {name:<36} {1000 * stats['median']:7.1f} ms a step ({change:+5.1f} %, cv {stats['cv']:.2f})")
    return common.save_step_results("attention_speed", argv, args, results)


if __name__ == "__main__":
    main()
