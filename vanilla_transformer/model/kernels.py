"""The speed paths, behind one seam: the paper's files call `Linear`, `dropout` and `cross_entropy` from here and
never choose a kernel themselves; `is_tracing` is the one "is a graph being captured?" check they all share.

- `Linear` and `packed_weights`: `nn.Linear` with a packed-weight CPU path for decoding (below).
- `attention`: the attention backend under CPU bf16 autocast (mixed-precision training on the CPU): the eager formula
  in bf16 for `sdpa` and `eager`, any other backend in fp32.
- `dropout`, `relu_dropout` and `keep_mask`: faster keep-masks for eager CPU training, and the FFN's ReLU and its
  dropout as one autograd node.
- `cross_entropy`: the chunked label-smoothed loss of `loss.py` for eager CPU runs, torch's fused kernel elsewhere.
- `fuses_output_loss` and `linear_cross_entropy`: where the output projection and the loss may run as one chunked
  autograd node (`loss.LinearCrossEntropy`), and that node.

Each path computes what the plain torch operation computes (to fp32 rounding; dropout draws its masks with the same
probability, to within 2⁻¹⁶), and compiled, exported or traced graphs always get the plain torch operation. Imports
only torch and a sibling, so that it can be shipped as remote code.

**Packed linear.** Every decoding step multiplies batch × beams rows (1 to a few dozen) by each decoder weight and by
the (vocab, d_model) output projection. For such shapes the default CPU GEMM re-packs the whole weight on every call
and reaches a fraction of the machine's rate; with the weight packed once into oneDNN's blocked layout (the packing
torch's inductor applies when it freezes a model) the output projection of a base-size decoding step runs about twice
as fast (docs/model.md, `cpu_weight_packing`). Inside `packed_weights(model)`, which `generate()` opens, a `Linear`
with `packed_inference` set (the model sets it from `config.cpu_weight_packing` for the decoder and `lm_head`) takes
the packed path when:

- autograd is off (as in `generate()`), the input and weight are fp32 on the CPU;
- no tracing, compiling or exporting is in progress, and torch is built with oneDNN;
- the input has at least `PACKED_MIN_ROWS` rows. That is 1 except on Intel CPUs, where MKL, which torch's `linear`
  calls, runs its own tuned kernels: there one or two rows multiply faster the default way and from 4 rows on the
  packed weight wins, while on AMD CPUs, where MKL does not run its tuned kernels, the packed weight wins even at one
  row. See `packed_min_rows`.

Everywhere else, training included, it is exactly `nn.Linear`. The packed copy is kept between calls (a second copy of
those weights in memory) and checked when a block opens: a new storage, a bumped version counter or a changed sample
of the weight (fused optimizers update weights without bumping the version) repacks it.
"""

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from .loss import IGNORE_INDEX, token_cross_entropy
from .loss import linear_cross_entropy as linear_cross_entropy  # the fused node, re-exported for the model

# module -> (weight key, packed weight); weak, so copies and deletions of modules need no care.
_PACKED: "weakref.WeakKeyDictionary[nn.Module, tuple[tuple, torch.Tensor]]" = weakref.WeakKeyDictionary()
_SAMPLE_SIZE = 64  # elements of the weight compared when a block opens
_ONE_BITS = {torch.bfloat16: 0x3F80, torch.float16: 0x3C00}  # the int16 bit pattern of 1.0 in each 16-bit float
MATH_ATTENTION_MAX_KEYS = 128  # longest key sequence that runs as the bf16 formula under CPU autocast (`attention`)


def packed_min_rows(cpuinfo: str | None = None) -> int:
    """Fewest rows (input elements / in_features) for which `Linear` takes the packed path inside `packed_weights`:
    4 on Intel CPUs, 1 elsewhere (see the module docstring). `cpuinfo` is the text of Linux's /proc/cpuinfo, read when
    not given; where it cannot be read, every row count is packed."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
                cpuinfo = handle.read(4096)  # the first processor's entry holds vendor_id
        except OSError:
            return 1
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "vendor_id":
            return 4 if value.strip() == "GenuineIntel" else 1
    return 1


PACKED_MIN_ROWS = packed_min_rows()


def _onednn_available() -> bool:
    ops = torch.ops.mkldnn
    return (
        torch.backends.mkldnn.is_available()
        and hasattr(ops, "_reorder_linear_weight")
        and hasattr(ops, "_linear_pointwise")
    )


def is_tracing() -> bool:
    """True while torch.compile, torch.export (and the ONNX exporter built on it), jit tracing or scripting captures a
    graph: the eager-only paths (and the models' input checks, whose data-dependent branches would become guards)
    step aside there."""
    compiler = torch.compiler
    return (
        compiler.is_compiling()
        or getattr(compiler, "is_exporting", lambda: False)()
        or torch.jit.is_tracing()
        or torch.jit.is_scripting()
        or torch.onnx.is_in_onnx_export()
    )


def _weight_key(weight: torch.Tensor) -> tuple:
    """Storage, version counter, shape and an evenly spaced sample of the values."""
    flat = weight.detach().reshape(-1)
    sample = flat[:: max(1, flat.numel() // _SAMPLE_SIZE)].clone()
    return (weight.data_ptr(), weight._version, tuple(weight.shape)), sample


class Linear(nn.Linear):
    """y = x Wᵀ + b, exactly `nn.Linear` (same parameters and state-dict keys), with the packed decoding path above."""

    packed_inference: bool = False  # may this module use a packed weight inside `packed_weights`?
    _packed_active: bool = False  # is a `packed_weights` block open and the packed weight current?

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self._packed_active and not torch.is_grad_enabled() and input.dtype == torch.float32 and not is_tracing():
            packed = _PACKED.get(self)
            rows = input.numel() // self.in_features if self.in_features else 0
            if packed is not None and input.device.type == "cpu" and rows >= PACKED_MIN_ROWS:
                return torch.ops.mkldnn._linear_pointwise(input, packed[1], self.bias, "none", [], "")
        return super().forward(input)

    def refresh_packed_weight(self) -> bool:
        """Pack the weight, or keep the packed copy if the weight is unchanged; returns whether one is ready."""
        weight = self.weight
        if weight.device.type != "cpu" or weight.dtype != torch.float32 or weight.is_meta:
            return False
        key, sample = _weight_key(weight)
        cached = _PACKED.get(self)
        if cached is not None and cached[0][0] == key and torch.equal(cached[0][1], sample):
            return True
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
        except RuntimeError:  # a oneDNN build without this kernel: stay on the default path
            return False
        _PACKED[self] = ((key, sample), packed)
        return True

    def release_packed_weight(self) -> None:
        """Drop the packed copy (rebuilt when the next block opens)."""
        _PACKED.pop(self, None)


@contextmanager
def packed_weights(model: nn.Module) -> Iterator[None]:
    """Within this block, the `Linear` modules of `model` that allow it run CPU fp32 inference on packed weights.

    Packed copies are made, or checked against the current weights, on entry. Nested blocks are allowed.
    """
    if not _onednn_available() or is_tracing():
        yield
        return
    opened = [m for m in model.modules() if isinstance(m, Linear) and m.packed_inference and not m._packed_active]
    opened = [m for m in opened if m.refresh_packed_weight()]
    for module in opened:
        module._packed_active = True
    try:
        yield
    finally:
        for module in opened:
            module._packed_active = False


def attention(interface: Callable, module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, *, math: Callable | None = None,
              **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """`interface(module, query, key, value, attention_mask, **kwargs)`, transformers' attention-function contract.

    Under CPU autocast (`--bf16 --use_cpu`) the projections around it run in bf16, where CPUs with AVX512-BF16 or AMX
    multiply about twice as fast as in fp32, but torch's CPU flash-attention backward is far slower in bf16 than in
    fp32 (docs/experiments/steps-and-speed.md, "Attention in bf16"). So there:

    - when `math` is given (the caller's eager formula, softmax(QKᵀ/√d_k)V, for the `sdpa` and `eager` backends) and
      there are at most `MATH_ATTENTION_MAX_KEYS` keys, it runs in the autocast dtype: QKᵀ and the product with V in
      bf16, the softmax in fp32 (as transformers' eager attention runs under GPU autocast). At the short lengths of
      translation batches the flash kernel's blocking is all overhead; from `MATH_ATTENTION_MAX_KEYS` keys on the
      fp32 kernel is faster, and it never holds the (batch, heads, queries, keys) weights. Where the `sdpa`
      backend would have taken `is_causal` (no mask, more than one query), the causal mask is built here;
    - otherwise the backend gets fp32 queries, keys and values (and mask) with autocast off, and its output is cast
      back to the queries' dtype.

    Elsewhere, and in captured graphs, the backend is called as it is.
    """
    if query.device.type != "cpu" or not torch.is_autocast_enabled("cpu") or is_tracing():
        return interface(module, query, key, value, attention_mask, **kwargs)
    if math is not None and key.shape[2] <= MATH_ATTENTION_MAX_KEYS:
        tgt_len, src_len = query.shape[2], key.shape[2]
        if attention_mask is None and tgt_len > 1 and getattr(module, "is_causal", True):
            # (tgt_len, src_len) True = attend; query i sees keys up to src_len - tgt_len + i, as sdpa's is_causal
            causal = torch.ones(tgt_len, src_len, dtype=torch.bool, device=query.device)
            attention_mask = causal.tril(src_len - tgt_len)
        output, weights = math(module, query, key, value, attention_mask, **kwargs)
        return output, (weights if interface is math else None)
    dtype = query.dtype
    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.float()
    with torch.autocast("cpu", enabled=False):
        output, weights = interface(module, query.float(), key.float(), value.float(), attention_mask, **kwargs)
    return output.to(dtype), weights


def keep_mask(x: torch.Tensor, p: float) -> tuple[torch.Tensor, float]:
    """A CPU keep-mask for dropout probability p, as 0s and 1s in x's shape and dtype, and the drop probability it
    realises.

    Each 64-bit draw of torch's generator (seeded by `torch.manual_seed`) gives four 16-bit lanes; each lane's top 15
    bits are a uniform u over [-2¹⁴, 2¹⁴), dropped when u < t = round(p · 2¹⁵) - 2¹⁴. The comparison runs as int16
    arithmetic, (u - t) >> 15 (the sign: -1 drop, 0 keep; u - t cannot overflow), + 1, and the mask is converted to
    x's dtype so that applying it is a plain vectorised product, an order of magnitude faster than a bool-by-bf16
    one (docs/experiments/steps-and-speed.md, "The ReLU and its dropout fused"). The realised probability
    round(p · 2¹⁵) / 2¹⁵ is p to within 2⁻¹⁶ (0.100006 for 0.1). Every step runs in place on the drawn words (fresh
    tensors cost page faults on the CPU): for bf16 and fp16 the mask is the words' own memory, read as x's dtype.
    """
    drops = round(p * 32768)  # of the 32,768 values of a 15-bit uniform, this many drop
    words = torch.empty((x.numel() + 3) // 4, dtype=torch.int64, device=x.device).random_(-(2**63), 2**63 - 1)
    lanes = words.view(torch.int16)[: x.numel()].view(x.shape)  # (same shape as x) uniform over [-2¹⁵, 2¹⁵)
    u = lanes.bitwise_right_shift_(1)  # in place: uniform over [-2¹⁴, 2¹⁴)
    keep = u.sub_(drops - 16384).bitwise_right_shift_(15).add_(1)  # in place: 0 drop, 1 keep
    if x.dtype in _ONE_BITS:  # 16-bit floats: 1 becomes the bit pattern of 1.0 in place, no new tensor
        return keep.mul_(_ONE_BITS[x.dtype]).view(x.dtype), drops / 32768
    return keep.to(x.dtype), drops / 32768


def _eager_cpu(x: torch.Tensor, p: float) -> bool:
    """Whether the package's CPU masks apply: eager, on the CPU, and p not within 2⁻¹⁶ of 1."""
    return x.device.type == "cpu" and not is_tracing() and round(p * 32768) < 32768


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Dropout (§5.4): zero each element with probability p, scale the rest by 1 / (1 - p).

    On CPU the keep-mask comes from `keep_mask` (four 16-bit lanes per 64-bit draw, compared in int16, applied as a
    product): torch's CPU `bernoulli_` behind `nn.functional.dropout` draws one float per element and takes several
    times as long. The mask (x's dtype) is what autograd keeps for the backward. Elsewhere, and in captured graphs,
    `nn.functional.dropout` is used.
    """
    if not training or p == 0.0:
        return x
    if not _eager_cpu(x, p):
        return nn.functional.dropout(x, p=p, training=True)
    keep, realised = keep_mask(x, p)
    return torch.mul(x, keep).mul_(1.0 / (1.0 - realised))


class _ReLUDropout(torch.autograd.Function):
    """Dropout(max(0, x)) with one saved tensor, its output y: y > 0 exactly where x > 0 and the element was kept,
    so the gradient is the incoming one times 1 / (1 - p) there and 0 elsewhere. The following projection (`fc2`)
    keeps y for its own backward already, so neither the mask nor the ReLU's output is held a second time, and the
    backward is two passes instead of three."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float) -> torch.Tensor:
        keep, realised = keep_mask(x, p)
        scale = 1.0 / (1.0 - realised)
        y = torch.relu(x).mul_(keep).mul_(scale)
        ctx.scale = scale
        ctx.save_for_backward(y)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (y,) = ctx.saved_tensors
        return torch.ops.aten.threshold_backward(grad, y, 0).mul_(ctx.scale), None


def relu_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """dropout(max(0, x), p): the FFN's ReLU and the dropout after it (§3.3; the dropout is not in the paper).

    In eager CPU training the two run as one autograd node (`_ReLUDropout`) with `keep_mask`'s masks, cheaper than a
    bool mask after a separate ReLU; what remains is the random draw itself, torch's serial CPU generator
    (docs/training.md, "Where the ReLU dropout's step cost lies"; measured in docs/experiments/dropout.md).
    Elsewhere it is `dropout(relu(x))` as written.
    """
    if not training or p == 0.0:
        return torch.relu(x)
    if not _eager_cpu(x, p):
        return nn.functional.dropout(torch.relu(x), p=p, training=True)
    return _ReLUDropout.apply(x, p)


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """(N, V) float logits and (N,) labels -> (N,) per-token losses with label smoothing ε (§5.4), computed in fp32
    (or the logits' dtype if wider), 0 where the label is `IGNORE_INDEX`.

    Eager CPU runs use the chunked loss of `loss.py` (its chunks are sized for CPU caches; 16-bit logits are widened
    chunk by chunk); accelerators and captured graphs use `nn.functional.cross_entropy` on fp32 logits, one fused
    kernel there.
    """
    if logits.device.type != "cpu" or is_tracing():
        return nn.functional.cross_entropy(
            logits.to(torch.promote_types(logits.dtype, torch.float32)), labels, ignore_index=IGNORE_INDEX,
            reduction="none", label_smoothing=label_smoothing,
        )  # fmt: skip
    return token_cross_entropy(logits, labels, label_smoothing)


def fuses_output_loss(head: nn.Module, hidden: torch.Tensor) -> bool:
    """Whether the output projection `head` and the loss may run as one node (`linear_cross_entropy`) on `hidden`.

    Only where the result is the unfused one to fp32 rounding and nothing is skipped that anything relies on: eager
    (no graph captured), on the CPU, fp32 hidden states and weight without autocast, `head` exactly this package's
    `Linear` without a bias (not a PEFT/LoRA or quantised replacement), with a plain tensor weight (not an FSDP or
    tensor-parallel DTensor), and no forward hooks on it or on all modules (FSDP and PEFT hook there: the fused node
    never calls `head`). The training loss of a model with the fused path differs in that the logits are not returned.
    """
    weight = getattr(head, "weight", None)
    return (
        type(head) is Linear
        and head.bias is None
        and type(weight) in (torch.Tensor, nn.Parameter)
        and hidden.device.type == "cpu" == weight.device.type
        and hidden.dtype == torch.float32 == weight.dtype
        and not torch.is_autocast_enabled("cpu")
        and not (head._forward_hooks or head._forward_pre_hooks)
        and not (nn.modules.module._global_forward_hooks or nn.modules.module._global_forward_pre_hooks)
        and not is_tracing()
    )
