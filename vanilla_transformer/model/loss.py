"""Token-level cross-entropy with label smoothing (§5.4), computed in row chunks with a closed-form gradient.

With ε the smoothing and V the vocabulary, each target token costs

    loss = (1 - ε) · (−log p_y) + ε · mean_v(−log p_v),    log p_v = z_v − logsumexp(z)

(the definition of `torch.nn.functional.cross_entropy(label_smoothing=ε)` and of transformers' `LabelSmoother`),
and its gradient with respect to the logits z is softmax(z) − (1 − ε) · onehot(y) − ε / V.

The output projection makes (tokens, V) logits: 262 MB for 2,048 target tokens and 32,000 words. The generic path
(log-softmax, gather, their backwards) writes and reads several tensors of that size; here the forward keeps only
one logsumexp per row, and the backward writes the gradient in one pass per chunk of rows small enough to stay in the
CPU caches, a fraction of the generic path's time in a CPU training step (docs/experiments/speed-log.md).

Low-precision logits (bf16 under CPU autocast) are read chunk by chunk into fp32, and the gradient is written back in
their dtype: the same values as casting the whole (N, V) tensor to fp32 first and its gradient back, without those two
copies.

`linear_cross_entropy` goes one step further for CPU fp32 training: the output projection and the loss together, in
row chunks (`LinearCrossEntropy`), so that neither the (tokens, V) logits nor their gradient ever exists whole.
Imports only torch, so that it can be shipped as remote code.
"""

import torch

IGNORE_INDEX = -100
CHUNK_ELEMENTS = 1 << 19  # rows per chunk x vocabulary: 2 MiB of fp32, about one core's L2 cache
PROJECTION_CHUNK_ELEMENTS = 1 << 24  # rows x vocabulary per matrix product of `LinearCrossEntropy`: 64 MiB of fp32


def _rows_per_chunk(vocab_size: int) -> int:
    return max(1, CHUNK_ELEMENTS // vocab_size)


def compute_dtype(logits: torch.Tensor) -> torch.dtype:
    """fp32 for 16-bit logits, their own dtype otherwise."""
    return torch.promote_types(logits.dtype, torch.float32)


def logsumexp_rows(logits: torch.Tensor) -> torch.Tensor:
    """(N, V) -> (N,) logsumexp of every row in `compute_dtype`, chunk by chunk (no (N, V) temporary)."""
    dtype = compute_dtype(logits)
    out = torch.empty(logits.shape[0], dtype=dtype, device=logits.device)
    step = _rows_per_chunk(logits.shape[1])
    for start in range(0, logits.shape[0], step):
        out[start : start + step] = torch.logsumexp(logits[start : start + step].to(dtype), dim=1)
    return out


def smoothed_loss(lse: torch.Tensor, logits: torch.Tensor, target: torch.Tensor, smoothing: float) -> torch.Tensor:
    """Rows of logits (n, V), their logsumexp (n,) and targets (n,) -> (n,) label-smoothed loss (§5.4) in lse's dtype:
    (1 − ε) · (−log p_y) + ε · (mean over the vocabulary of −log p)."""
    loss = lse - logits.gather(1, target[:, None]).squeeze(1).to(lse.dtype)  # −log p_y
    if smoothing:
        loss = (1.0 - smoothing) * loss + smoothing * (lse - logits.mean(dim=1, dtype=lse.dtype))
    return loss


def write_smoothed_gradient(
    logits: torch.Tensor, target: torch.Tensor, scale: torch.Tensor, smoothing: float, out: torch.Tensor
) -> None:
    """The gradient of `smoothed_loss` for rows of logits (n, V), scale · (softmax − (1 − ε) · onehot − ε / V), into
    `out` (n, V; may be `logits` itself): one fused softmax in scale's dtype, then one addcmul in out's dtype.
    `scale` (n, 1) is the incoming gradient, 0 for ignored rows."""
    probs = torch.softmax(logits, dim=1, dtype=scale.dtype)
    probs.scatter_add_(1, target[:, None], torch.full_like(scale, -(1.0 - smoothing)))
    torch.addcmul(scale * (-smoothing / logits.shape[1]), probs, scale, out=out)


class SmoothedCrossEntropy(torch.autograd.Function):
    """Per-token loss (N,) from logits (N, V) and labels (N,); ignored labels (`IGNORE_INDEX`) give 0 and no
    gradient."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, smoothing: float) -> torch.Tensor:
        valid = labels != IGNORE_INDEX
        target = torch.where(valid, labels, 0)
        lse = logsumexp_rows(logits)  # (N,) in compute_dtype
        loss = smoothed_loss(lse, logits, target, smoothing)
        ctx.smoothing = smoothing
        ctx.save_for_backward(logits, lse, target, valid)
        return torch.where(valid, loss, 0.0)

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        logits, lse, target, valid = ctx.saved_tensors
        scale = torch.where(valid, grad_loss.to(lse.dtype), 0.0)[:, None]  # (N, 1)
        grad = torch.empty_like(logits)
        step = _rows_per_chunk(logits.shape[1])
        for start in range(0, logits.shape[0], step):
            rows = slice(start, start + step)
            # read in the logits' dtype (16-bit or not), softmax in compute_dtype, written back in the logits' dtype
            write_smoothed_gradient(logits[rows], target[rows], scale[rows], ctx.smoothing, grad[rows])
        return grad, None, None


def token_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """(N, V) float logits and (N,) labels -> (N,) per-token losses (fp32 for 16-bit logits), 0 where the label is
    `IGNORE_INDEX`."""
    _check_smoothing(label_smoothing)
    if logits.dim() != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(
            f"Expected logits (N, V) and labels (N,), got {tuple(logits.shape)} and {tuple(labels.shape)}"
        )
    return SmoothedCrossEntropy.apply(logits, labels, float(label_smoothing))


def _check_smoothing(label_smoothing: float) -> None:
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing!r}")


class LinearCrossEntropy(torch.autograd.Function):
    """Sum over tokens of the label-smoothed loss (§5.4) of the logits h Wᵀ + b, with the gradient computed in the
    forward.

    Rows of h are taken `PROJECTION_CHUNK_ELEMENTS // V` at a time: their logits go into one (rows, V) buffer reused
    for every chunk, are reduced to the loss in cache-sized sub-chunks, and overwritten in place by their gradient
    softmax(z) − (1 − ε) · onehot(y) − ε / V (0 for ignored rows), which the two products of the backward consume at
    once: grad_h[rows] = g W and grad_W += gᵀ h[rows] (and grad_b += Σ g). The output is a scalar, so the backward
    only scales the saved gradients by the incoming one. The matrix products are those of the unfused path; what is
    gone is writing, page-faulting and re-reading two (tokens, V) tensors.
    """

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
                smoothing: float) -> torch.Tensor:  # fmt: skip
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        need_grad = need_hidden or need_weight or need_bias
        tokens, vocab_size = hidden.shape[0], weight.shape[0]
        valid = labels != IGNORE_INDEX
        target = torch.where(valid, labels, 0)
        scale = valid.to(hidden.dtype)[:, None]  # (N, 1): 1 where the token counts, 0 where it is ignored
        step = max(1, PROJECTION_CHUNK_ELEMENTS // vocab_size)
        sub = _rows_per_chunk(vocab_size)
        buffer = hidden.new_empty(min(step, tokens), vocab_size)
        grad_hidden = hidden.new_empty(hidden.shape) if need_hidden else None
        grad_weight = weight.new_empty(weight.shape) if need_weight else None
        grad_bias = torch.zeros_like(bias) if need_bias else None
        total = hidden.new_zeros(())
        for start in range(0, tokens, step):
            rows = slice(start, start + step)
            h = hidden[rows]
            z = buffer[: h.shape[0]]
            if bias is None:
                torch.mm(h, weight.t(), out=z)
            else:
                torch.addmm(bias, h, weight.t(), out=z)
            for s in range(0, z.shape[0], sub):
                zs = z[s : s + sub]
                tokens_in = slice(start + s, start + s + zs.shape[0])
                tgt, w = target[tokens_in], scale[tokens_in]
                loss = smoothed_loss(torch.logsumexp(zs, dim=1), zs, tgt, smoothing)
                total += (loss * w.squeeze(1)).sum()
                if need_grad:  # the chunk's gradient, in place of its logits
                    write_smoothed_gradient(zs, tgt, w, smoothing, out=zs)
            if need_hidden:
                torch.mm(z, weight, out=grad_hidden[rows])
            if need_weight:  # the first chunk writes the weight's gradient, later ones add to it
                torch.addmm(grad_weight, z.t(), h, beta=1 if start else 0, out=grad_weight)
            if need_bias:
                grad_bias += z.sum(dim=0)
        ctx.save_for_backward(*(g for g in (grad_hidden, grad_weight, grad_bias) if g is not None))
        ctx.present = (need_hidden, need_weight, need_bias)
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_total: torch.Tensor):
        saved = iter(ctx.saved_tensors)
        grads = [next(saved) * grad_total if present else None for present in ctx.present]
        return *grads, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, labels: torch.Tensor,
                         label_smoothing: float = 0.0) -> torch.Tensor:  # fmt: skip
    """Hidden states (N, D), output weight (V, D), optional bias (V,) and labels (N,) -> the sum over the tokens
    whose label is not `IGNORE_INDEX` of the label-smoothed loss (§5.4) of h Wᵀ + b: `token_cross_entropy(h Wᵀ + b,
    labels, ε).sum()`, without the (N, V) logits or their gradient (`LinearCrossEntropy`)."""
    _check_smoothing(label_smoothing)
    shapes_fit = hidden.dim() == weight.dim() == 2 and hidden.shape[1] == weight.shape[1]
    if not shapes_fit or labels.shape != hidden.shape[:1]:
        raise ValueError(
            f"Expected hidden (N, D), weight (V, D) and labels (N,), got {tuple(hidden.shape)}, "
            f"{tuple(weight.shape)} and {tuple(labels.shape)}"
        )
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"Expected bias ({weight.shape[0]},), got {tuple(bias.shape)}")
    if not (hidden.dtype == weight.dtype == (weight.dtype if bias is None else bias.dtype)):
        raise ValueError(f"hidden, weight and bias must share one dtype, got {hidden.dtype} and {weight.dtype}")
    return LinearCrossEntropy.apply(hidden, weight, bias, labels, float(label_smoothing))
