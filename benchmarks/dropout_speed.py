"""CPU dropout and loss in a `small` bf16 training step: the keep-mask draw alone (the package's `kernels.keep_mask`,
four 16-bit lanes per 64-bit draw compared in int16 into a mask of x's dtype, against the same lanes compared into a
bool mask as before, `rand_like(x) >= p` and torch's `bernoulli_`), one layer's dropout forward and backward (the
package's against the bool masks), then training steps with each dropout turned on
(residual only, the default; + attention weights; + the FFN's ReLU; both), with the package's masks and fused
ReLU-dropout, with the bool masks and a separate ReLU (before), and with `rand_like` masks, and the default step with
its loss fed fp32 logits (the whole (tokens, vocab) tensor cast first, as before the loss widened bf16 logits chunk by
chunk) and with the loss's backward as before (widen, subtract, exp, scale and narrow in separate passes, where it now
runs one fused softmax and one addcmul per chunk); the loss alone too, against torch's `cross_entropy`; interleaved.

One step = forward with labels under bf16 autocast (as the main job trains on CPUs with native bf16), backward,
AdamW, on a fixed batch of 48 x 21 source and target tokens (about the main job's 1,024-token batches).

    python -m benchmarks.dropout_speed --rounds 30
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from benchmarks import common

MASK_ELEMENTS = 1 << 20
BATCH, LENGTH = 48, 21
PACKAGE, BOOL_MASKS, RAND_LIKE = "package", "bool masks, separate ReLU", "rand_like masks"
FP32_LOGITS = "package, loss fed fp32 logits"
LOSS_BEFORE = "package, loss backward as before"
LOSS_ROWS, LOSS_VOCAB = BATCH * LENGTH, 8000


def _bool_keep_mask(x, p: float):
    """The package's keep-mask as it was: the same 16-bit lanes, compared into a bool mask."""
    import torch

    drops = round(p * 65536)
    words = torch.empty((x.numel() + 3) // 4, dtype=torch.int64).random_(-(2**63), 2**63 - 1)
    lanes = words.view(torch.int16)[: x.numel()].view(x.shape)
    return lanes >= drops - 32768, drops / 65536


def _bool_dropout(x, p: float, training: bool):
    """The package's CPU dropout as it was: a bool mask, multiplied in."""
    if not training or p == 0.0:
        return x
    import torch

    keep, realised = _bool_keep_mask(x, p)
    return torch.mul(x, keep).mul_(1.0 / (1.0 - realised))


def _rand_like_dropout(x, p: float, training: bool):
    """The package's CPU dropout as it was: one float draw per element."""
    if not training or p == 0.0:
        return x
    import torch

    return torch.mul(x, torch.rand_like(x) >= p).mul_(1.0 / (1.0 - p))


def _loss_backward_before(ctx, grad_loss):
    """`loss.SmoothedCrossEntropy.backward` as it was: each chunk widened, then softmax, smoothing and scale written
    by separate in-place passes, and narrowed back into the gradient."""
    import torch

    from vanilla_transformer.model.loss import _rows_per_chunk

    logits, lse, target, valid = ctx.saved_tensors
    smoothing, vocab_size = ctx.smoothing, logits.shape[1]
    scale = torch.where(valid, grad_loss.to(lse.dtype), 0.0)[:, None]  # (N, 1)
    grad = torch.empty_like(logits)
    in_place = logits.dtype == lse.dtype
    step = _rows_per_chunk(vocab_size)
    for start in range(0, logits.shape[0], step):
        rows = slice(start, start + step)
        chunk = logits[rows]
        if in_place:
            probs = torch.sub(chunk, lse[rows, None], out=grad[rows]).exp_()
        else:
            probs = torch.sub(chunk.to(lse.dtype), lse[rows, None]).exp_()
        if smoothing:
            probs.sub_(smoothing / vocab_size)
        probs.mul_(scale[rows])
        probs.scatter_add_(1, target[rows, None], -(1.0 - smoothing) * scale[rows])
        if not in_place:
            grad[rows].copy_(probs)
    return grad, None, None


@contextlib.contextmanager
def variant(name: str) -> Iterator[None]:
    """Run the step as the package does, with the bool masks and a separate ReLU or `rand_like` masks in the layers
    (attention dropout runs inside the attention backend either way), or with the loss fed fp32 logits or its backward
    as before."""
    import torch

    from vanilla_transformer.model import kernels, layers
    from vanilla_transformer.model import modeling_vanilla_transformer as modeling
    from vanilla_transformer.model.loss import SmoothedCrossEntropy

    saved = layers.dropout, layers.relu_dropout, modeling.cross_entropy
    saved_backward = SmoothedCrossEntropy.backward
    if name in (RAND_LIKE, BOOL_MASKS):
        layers.dropout = _rand_like_dropout if name == RAND_LIKE else _bool_dropout
        layers.relu_dropout = lambda x, p, training: layers.dropout(torch.relu(x), p, training)
    elif name == FP32_LOGITS:
        modeling.cross_entropy = lambda logits, labels, eps: kernels.cross_entropy(logits.float(), labels, eps)
    elif name == LOSS_BEFORE:
        SmoothedCrossEntropy.backward = staticmethod(_loss_backward_before)
    try:
        yield
    finally:
        layers.dropout, layers.relu_dropout, modeling.cross_entropy = saved
        SmoothedCrossEntropy.backward = saved_backward


def mask_systems() -> dict[str, Callable[[], object]]:
    import torch

    from vanilla_transformer.model.kernels import keep_mask

    x = torch.empty(MASK_ELEMENTS, dtype=torch.bfloat16)  # the FFN masks are bf16 under autocast
    return {
        "bernoulli_ (nn.functional.dropout)": lambda: torch.empty_like(x).bernoulli_(0.9),
        "rand_like(x) >= p": lambda: torch.rand_like(x) >= 0.1,
        "16-bit lanes compared into bool (before)": lambda: _bool_keep_mask(x, 0.1),
        "keep_mask (int16 compare, the package)": lambda: keep_mask(x, 0.1),
    }


def layer_systems() -> dict[str, Callable[[], object]]:
    """Forward and backward of one dropout on a `small` step's bf16 activations: a residual dropout on (1,008, 256)
    and the FFN's ReLU with its dropout on (1,008, 1,024), the package's against bool masks (and a separate ReLU)."""
    import torch

    from vanilla_transformer.model.kernels import dropout, relu_dropout

    gen = torch.Generator().manual_seed(common.SEED)
    residual, ffn = (torch.randn(BATCH * LENGTH, d, generator=gen).bfloat16() for d in (256, 1024))

    def run(fn, x):
        def once():
            leaf = x.detach().requires_grad_()
            fn(leaf).backward(x)

        return once

    return {
        "residual dropout 0.1, package": run(lambda t: dropout(t, 0.1, True), residual),
        "residual dropout 0.1, bool mask (before)": run(lambda t: _bool_dropout(t, 0.1, True), residual),
        "ReLU + dropout 0.1, package (fused)": run(lambda t: relu_dropout(t, 0.1, True), ffn),
        "ReLU + dropout 0.1, bool mask, separate ReLU": run(lambda t: _bool_dropout(torch.relu(t), 0.1, True), ffn),
        "ReLU alone": run(torch.relu, ffn),
    }


def loss_systems() -> dict[str, Callable[[], object]]:
    """Forward and backward of the label-smoothed (0.1) loss on a `small` step's bf16 logits, (1,008, 8,000)."""
    import torch

    from vanilla_transformer.model.kernels import cross_entropy

    gen = torch.Generator().manual_seed(common.SEED)
    logits = (3 * torch.randn(LOSS_ROWS, LOSS_VOCAB, generator=gen)).bfloat16()
    labels = torch.randint(0, LOSS_VOCAB, (LOSS_ROWS,), generator=gen)
    upstream = torch.rand(LOSS_ROWS, generator=gen)

    def run(name):
        def once():
            leaf = logits.detach().requires_grad_()
            with variant(name):
                cross_entropy(leaf, labels, 0.1).backward(upstream)

        return once

    def torch_fp32():
        leaf = logits.detach().requires_grad_()
        loss = torch.nn.functional.cross_entropy(leaf.float(), labels, reduction="none", label_smoothing=0.1)
        loss.backward(upstream)

    return {
        "package": run(PACKAGE),
        "package, backward as before": run(LOSS_BEFORE),
        "torch cross_entropy (fp32 copy)": torch_fp32,
    }


def step_system(attention_dropout: float, activation_dropout: float, name: str) -> Callable[[], object]:
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
        with variant(name):
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(input_ids=source, labels=labels).loss
            loss.backward()
            optimizer.step()
        return loss.item()

    return step


def main(argv: list[str] | None = None) -> dict:
    args = common.step_arguments(__doc__.splitlines()[0], 30, argv)

    results = {}
    print(f"keep-mask draw of {MASK_ELEMENTS:,} elements, p = 0.1, median of {args.rounds} rounds:")
    times = common.run_interleaved(mask_systems(), rounds=args.rounds, warmup=3)
    for name, t in times.items():
        results[name] = common.summarize(t)
        print(f"  {name:<36} {1000 * results[name]['median']:7.2f} ms")

    print(f"one layer's dropout, forward and backward, bf16, {BATCH * LENGTH} tokens, median of {args.rounds} rounds:")
    times = common.run_interleaved(layer_systems(), rounds=args.rounds, warmup=3)
    for name, t in times.items():
        results[name] = common.summarize(t)
        print(f"  {name:<46} {1000 * results[name]['median']:7.3f} ms")

    print(f"label-smoothed loss, forward and backward, bf16 logits ({LOSS_ROWS:,}, {LOSS_VOCAB:,}), median:")
    times = common.run_interleaved(loss_systems(), rounds=args.rounds, warmup=3)
    for name, t in times.items():
        results[f"loss: {name}"] = common.summarize(t)
        print(f"  {name:<46} {1000 * results[f'loss: {name}']['median']:7.2f} ms")

    print(f"small-preset training step, bf16 autocast, {BATCH}x{LENGTH} tokens, median of {args.rounds} rounds:")
    settings = {
        "residual dropout only (default)": (0.0, 0.0),
        "+ attention 0.1": (0.1, 0.0),
        "+ ReLU 0.1": (0.0, 0.1),
        "+ attention and ReLU 0.1": (0.1, 0.1),
    }
    cases = [(label, PACKAGE) for label in settings]
    cases += [("residual dropout only (default)", BOOL_MASKS), ("+ ReLU 0.1", BOOL_MASKS)]
    cases += [("residual dropout only (default)", RAND_LIKE), ("+ ReLU 0.1", RAND_LIKE)]
    cases += [("residual dropout only (default)", FP32_LOGITS), ("residual dropout only (default)", LOSS_BEFORE)]
    systems = {f"{label}, {name}": step_system(*settings[label], name) for label, name in cases}
    times = common.run_interleaved(systems, rounds=args.rounds, warmup=3)
    for name, t in times.items():
        results[name] = common.summarize(t)
        print(f"  {name:<62} {1000 * results[name]['median']:7.1f} ms (cv {results[name]['cv']:.2f})")
    return common.save_step_results("dropout_speed", argv, args, results)


if __name__ == "__main__":
    main()
