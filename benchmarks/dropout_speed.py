"""CPU dropout: the keep-mask draw alone, and a `small`-preset training step with and without the attention and ReLU
dropouts, the package's mask (`rand_like(x) >= p`, in `kernels.dropout`) against a candidate that splits each 64-bit
draw into four 16-bit uniforms, put in for the layers' residual and ReLU dropout; interleaved.

One step = forward with labels under bf16 autocast (as the main job trains on CPUs with native bf16), backward,
AdamW, on a fixed batch of 48 x 21 source and target tokens (about the main job's 1,024-token batches).

    python -m benchmarks.dropout_speed --rounds 30
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator

from benchmarks import common

MASK_ELEMENTS = 1 << 20
BATCH, LENGTH = 48, 21


def lane_keep_mask(x, p: float):
    """The candidate mask: each 64-bit draw of torch's generator split into four 16-bit uniforms, compared with a
    threshold (drop probability round(p · 2¹⁶) / 2¹⁶); a quarter of the generator calls of `rand_like`."""
    import torch

    threshold = round(p * 65536) - 32768
    words = torch.empty((x.numel() + 3) // 4, dtype=torch.int64, device=x.device).random_(-(2**63), 2**63 - 1)
    return words.view(torch.int16)[: x.numel()].view(x.shape) >= threshold  # (same shape as x) 16-bit uniforms


def _lane_dropout(x, p: float, training: bool):
    """The package's CPU dropout (`kernels.dropout`) with the candidate mask."""
    if not training or p == 0.0:
        return x
    import torch

    return torch.mul(x, lane_keep_mask(x, p)).mul_(1.0 / (1.0 - p))


@contextlib.contextmanager
def mask_source(name: str) -> Iterator[None]:
    """Run the layers' dropout with the named keep-mask draw: the package's ("rand_like") or the candidate."""
    from vanilla_transformer.model import layers

    original = layers.dropout
    layers.dropout = original if name == "rand_like" else _lane_dropout
    try:
        yield
    finally:
        layers.dropout = original


def mask_systems() -> dict[str, Callable[[], object]]:
    import torch

    x = torch.empty(MASK_ELEMENTS)
    return {
        "bernoulli_ (nn.functional.dropout)": lambda: torch.empty_like(x).bernoulli_(0.9),
        "rand_like(x) >= p": lambda: torch.rand_like(x) >= 0.1,
        "16-bit lanes of 64-bit draws": lambda: lane_keep_mask(x, 0.1),
    }


def step_system(attention_dropout: float, activation_dropout: float, mask: str) -> Callable[[], object]:
    import torch

    from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

    torch.manual_seed(common.SEED)
    config = VanillaTransformerConfig.from_preset(
        "small", vocab_size=8000, attention_dropout=attention_dropout, activation_dropout=activation_dropout
    )
    model = VanillaTransformerForConditionalGeneration(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(common.SEED)
    source = torch.randint(4, 8000, (BATCH, LENGTH), generator=gen)
    labels = torch.randint(4, 8000, (BATCH, LENGTH), generator=gen)

    def step() -> float:
        with mask_source(mask):
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(input_ids=source, labels=labels).loss
            loss.backward()
            optimizer.step()
        return loss.item()

    return step


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=common.THREADS)
    args = parser.parse_args(argv)
    common.pin_threads(args.threads)

    results = {}
    print(f"keep-mask draw of {MASK_ELEMENTS:,} elements, p = 0.1, median of {args.rounds} rounds:")
    times = common.run_interleaved(mask_systems(), rounds=args.rounds, warmup=3)
    for name, t in times.items():
        results[name] = common.summarize(t)
        print(f"  {name:<36} {1000 * results[name]['median']:7.2f} ms")

    print(f"small-preset training step, bf16 autocast, {BATCH}x{LENGTH} tokens, median of {args.rounds} rounds:")
    systems = {
        f"{label}, {mask}": step_system(*dropouts, mask)
        for label, dropouts in (("residual dropout only", (0.0, 0.0)), ("+ attention and ReLU 0.1", (0.1, 0.1)))
        for mask in ("rand_like", "16-bit lanes")
    }
    times = common.run_interleaved(systems, rounds=args.rounds, warmup=3)
    for name, t in times.items():
        results[name] = common.summarize(t)
        print(f"  {name:<46} {1000 * results[name]['median']:7.1f} ms (cv {results[name]['cv']:.2f})")
    noise = common.noise_line(results)
    print(noise)
    return common.save_results(
        "dropout_speed", "dropout_speed", argv, machine=common.machine_info(args.threads), settings=vars(args),
        results=results, noise=noise,
    )  # fmt: skip


if __name__ == "__main__":
    main()
