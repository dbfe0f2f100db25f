"""The chunked cross-entropy with label smoothing, and the fused output projection plus loss, against torch's
`cross_entropy` on full logits and transformers' `LabelSmoother`."""

import pytest
import torch
from transformers.trainer_pt_utils import LabelSmoother

from tests.conftest import make_model, padded_batch
from vanilla_transformer.model import loss as loss_module
from vanilla_transformer.model.loss import linear_cross_entropy, token_cross_entropy


def _case(rows: int = 23, vocab: int = 37, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g, dtype=torch.float64) * 3
    labels = torch.randint(0, vocab, (rows,), generator=g)
    labels[[2, 7, 8]] = -100
    return logits, labels


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """Several chunks per call, the last one partial, even on tiny inputs (for the fused loss: products of 12 rows
    at 37 words, each reduced 5 rows at a time)."""
    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", 37 * 5)
    monkeypatch.setattr(loss_module, "PROJECTION_CHUNK_ELEMENTS", 37 * 12)


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.5])
def test_values_and_gradients_match_torch_cross_entropy(smoothing):
    logits, labels = _case()
    ours_in, ref_in = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    ours = token_cross_entropy(ours_in, labels, smoothing)
    ref = torch.nn.functional.cross_entropy(ref_in, labels, reduction="none", label_smoothing=smoothing)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    weights = torch.rand(len(labels), dtype=torch.float64)  # a non-uniform upstream gradient
    (ours * weights).sum().backward()
    (ref * weights).sum().backward()
    torch.testing.assert_close(ours_in.grad, ref_in.grad, rtol=1e-12, atol=1e-12)
    assert torch.all(ours_in.grad[[2, 7, 8]] == 0)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_bf16_logits_give_the_values_of_casting_them_to_fp32_first(smoothing):
    """bf16 logits (CPU autocast) are widened chunk by chunk: the loss equals that of the fp32 copy bit for bit, and
    the gradient equals the fp32 copy's gradient rounded to bf16; both match torch's cross_entropy on the fp32 copy."""
    logits, labels = _case()
    low = logits.to(torch.bfloat16).requires_grad_()
    wide = low.detach().float().requires_grad_()
    ref_in = low.detach().float().requires_grad_()
    ours, cast_first = token_cross_entropy(low, labels, smoothing), token_cross_entropy(wide, labels, smoothing)
    assert ours.dtype == torch.float32 and torch.equal(ours, cast_first)
    ref = torch.nn.functional.cross_entropy(ref_in, labels, reduction="none", label_smoothing=smoothing)
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)
    weights = torch.rand(len(labels))
    for loss in (ours, cast_first, ref):
        (loss * weights).sum().backward()
    assert low.grad.dtype == torch.bfloat16 and torch.equal(low.grad, wide.grad.to(torch.bfloat16))
    torch.testing.assert_close(low.grad.float(), ref_in.grad, rtol=1e-2, atol=1e-3)


def test_gradcheck():
    logits, labels = _case(rows=9, vocab=11)
    assert torch.autograd.gradcheck(lambda z: token_cross_entropy(z, labels, 0.1), logits.requires_grad_())


def test_model_loss_matches_transformers_label_smoother():
    model = make_model(seed=4)
    src, mask = padded_batch()
    labels = src.clone()
    labels[mask == 0] = -100
    with torch.no_grad():
        out = model(input_ids=src, attention_mask=mask, labels=labels, label_smoothing=0.1)
        expected = LabelSmoother(epsilon=0.1)(out, labels)  # log-softmax, gather, mean over active tokens
        torch.testing.assert_close(out.loss, expected, rtol=1e-5, atol=1e-6)
        plain = model(input_ids=src, attention_mask=mask, labels=labels)
        flat = torch.nn.functional.cross_entropy(plain.logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        torch.testing.assert_close(plain.loss, flat, rtol=1e-5, atol=1e-6)


def test_bad_arguments_are_named():
    logits, labels = _case()
    with pytest.raises(ValueError, match="label_smoothing"):
        token_cross_entropy(logits, labels, 1.0)
    with pytest.raises(ValueError, match="logits"):
        token_cross_entropy(logits[None], labels)


def test_accelerator_tensors_take_torch_cross_entropy(monkeypatch):
    """The chunked loss is sized for CPU caches; on other devices (here: meta) the fused torch kernel is used."""
    from vanilla_transformer.model import kernels
    from vanilla_transformer.model import modeling_vanilla_transformer as modeling

    def fail(*args, **kwargs):
        raise AssertionError("the chunked CPU loss ran on a non-CPU tensor")

    monkeypatch.setattr(kernels, "token_cross_entropy", fail)
    logits = torch.empty(2, 5, 37, device="meta")
    labels = torch.zeros(2, 5, dtype=torch.long, device="meta")
    assert modeling.seq2seq_cross_entropy(logits, labels, label_smoothing=0.1).shape == ()
    with pytest.raises(AssertionError, match="chunked CPU loss"):
        modeling.seq2seq_cross_entropy(torch.zeros(2, 5, 37), torch.zeros(2, 5, dtype=torch.long))


def _projection_case(rows: int = 23, width: int = 13, vocab: int = 37, dtype=torch.float64, seed: int = 0):
    """Hidden states (rows, width), weight (vocab, width), bias (vocab,) and labels with three ignored."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, width, generator=g, dtype=dtype)
    weight = torch.randn(vocab, width, generator=g, dtype=dtype) * 0.7
    bias = torch.randn(vocab, generator=g, dtype=dtype)
    labels = torch.randint(0, vocab, (rows,), generator=g)
    labels[[2, 7, 8]] = -100
    return hidden, weight, bias, labels


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fused_projection_loss_matches_torch_cross_entropy_on_full_logits(smoothing, with_bias, dtype):
    """The summed loss and the gradients for the hidden states, the weight and the bias, against torch's
    `cross_entropy(label_smoothing=ε)` on the whole logits h Wᵀ + b."""
    hidden, weight, bias, labels = _projection_case(dtype=dtype)
    bias = bias if with_bias else None
    ours_in = [t.clone().requires_grad_() for t in (hidden, weight) + ((bias,) if with_bias else ())]
    ref_in = [t.detach().clone().requires_grad_() for t in ours_in]
    ours = linear_cross_entropy(ours_in[0], ours_in[1], ours_in[2] if with_bias else None, labels, smoothing)
    logits = torch.nn.functional.linear(*ref_in)
    ref = torch.nn.functional.cross_entropy(logits, labels, reduction="sum", label_smoothing=smoothing)
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    assert ours.shape == () and ours.dtype == dtype
    torch.testing.assert_close(ours, ref, **tol)
    (ours * 0.37).backward()  # the backward scales the gradients computed in the forward
    (ref * 0.37).backward()
    for name, a, b in zip(("hidden", "weight", "bias"), ours_in, ref_in, strict=False):
        torch.testing.assert_close(a.grad, b.grad, **tol, msg=name)
    assert torch.all(ours_in[0].grad[[2, 7, 8]] == 0)


def test_fused_projection_loss_gradcheck():
    hidden, weight, bias, labels = _projection_case(rows=9, width=5, vocab=11)
    inputs = tuple(t.requires_grad_() for t in (hidden, weight, bias))
    assert torch.autograd.gradcheck(lambda h, w, b: linear_cross_entropy(h, w, b, labels, 0.1), inputs)


def test_fused_projection_loss_computes_only_the_gradients_asked_for():
    """Without autograd only the loss; with a frozen weight no weight gradient (and the same hidden gradient)."""
    hidden, weight, _, labels = _projection_case(dtype=torch.float32)
    expected = token_cross_entropy(hidden @ weight.T, labels, 0.1).sum()
    with torch.no_grad():
        torch.testing.assert_close(linear_cross_entropy(hidden, weight, None, labels, 0.1), expected)
    h = hidden.clone().requires_grad_()
    linear_cross_entropy(h, weight, None, labels, 0.1).backward()
    h_ref = hidden.clone().requires_grad_()
    token_cross_entropy(h_ref @ weight.T, labels, 0.1).sum().backward()
    torch.testing.assert_close(h.grad, h_ref.grad)


def test_fused_projection_loss_bad_arguments_are_named():
    hidden, weight, bias, labels = _projection_case()
    with pytest.raises(ValueError, match="label_smoothing"):
        linear_cross_entropy(hidden, weight, None, labels, -0.1)
    with pytest.raises(ValueError, match="weight"):
        linear_cross_entropy(hidden, weight.T, None, labels)
    with pytest.raises(ValueError, match="labels"):
        linear_cross_entropy(hidden, weight, None, labels[:-1])
    with pytest.raises(ValueError, match="bias"):
        linear_cross_entropy(hidden, weight, bias[:-1], labels)
    with pytest.raises(ValueError, match="dtype"):
        linear_cross_entropy(hidden.float(), weight, None, labels)
