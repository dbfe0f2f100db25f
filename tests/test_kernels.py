"""The speed paths of `kernels.py` against the plain torch operations: `Linear`'s packed CPU decoding path (and the
model's use of it in `generate()`), the CPU dropout, and the one tracing check."""

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from tests.conftest import make_model, padded_batch
from vanilla_transformer.model import kernels
from vanilla_transformer.model.kernels import (
    _PACKED,
    Linear,
    _onednn_available,
    attention,
    dropout,
    fuses_output_loss,
    is_tracing,
    keep_mask,
    packed_min_rows,
    packed_weights,
    relu_dropout,
)

needs_onednn = pytest.mark.skipif(not _onednn_available(), reason="torch built without oneDNN: nothing is packed")


def _ops(fn) -> set[str]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {event.name for event in prof.events()}


@pytest.fixture
def every_row_count_packed(monkeypatch):
    """The packed path for any number of rows, whatever CPU runs the test (on Intel CPUs 1-3 rows take the default)."""
    monkeypatch.setattr(kernels, "PACKED_MIN_ROWS", 1)


def _packed(module: torch.nn.Module) -> Linear:
    layer = module if isinstance(module, Linear) else Linear(13, 7)
    layer.packed_inference = True
    return layer


@needs_onednn
@pytest.mark.parametrize("shape", [(1, 13), (3, 1, 13), (2, 5, 13)])
@pytest.mark.parametrize("bias", [True, False])
def test_packed_path_matches_functional_linear(shape, bias, every_row_count_packed):
    torch.manual_seed(0)
    layer = _packed(Linear(13, 7, bias=bias))
    x = torch.randn(*shape)
    expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
    with torch.no_grad(), packed_weights(layer):
        assert "mkldnn::_linear_pointwise" in _ops(lambda: layer(x))
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-6)
    assert "mkldnn::_linear_pointwise" not in _ops(lambda: layer(x))  # the block is closed


@needs_onednn
def test_rows_below_the_threshold_take_the_default_path(monkeypatch):
    monkeypatch.setattr(kernels, "PACKED_MIN_ROWS", 4)
    torch.manual_seed(0)
    layer = _packed(Linear(13, 7))
    with torch.no_grad(), packed_weights(layer):
        for shape, packed in [((3, 13), False), ((3, 1, 13), False), ((4, 13), True), ((2, 2, 13), True)]:
            x = torch.randn(*shape)
            assert ("mkldnn::_linear_pointwise" in _ops(lambda x=x: layer(x))) == packed, shape
            torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, layer.weight, layer.bias))


@pytest.mark.parametrize(
    ("vendor", "rows"), [("GenuineIntel", 4), ("AuthenticAMD", 1), ("HygonGenuine", 1), (None, 1)]
)
def test_packed_min_rows_by_cpu_vendor(vendor, rows):
    """MKL runs its tuned kernels on Intel CPUs only: there one to three rows stay on torch's own `linear`."""
    cpuinfo = "processor\t: 0\n" + (f"vendor_id\t: {vendor}\n" if vendor else "") + "model name\t: a CPU\n"
    assert packed_min_rows(cpuinfo) == rows
    assert kernels.PACKED_MIN_ROWS in (1, 4)


@needs_onednn
def test_default_path_with_autograd_or_without_permission():
    torch.manual_seed(0)
    layer = _packed(Linear(13, 7))
    plain = Linear(13, 7)  # packed_inference not set
    double = _packed(Linear(13, 7)).double()
    x = torch.randn(4, 13)
    with packed_weights(layer), packed_weights(plain), packed_weights(double):
        assert "mkldnn::_linear_pointwise" not in _ops(lambda: layer(x))  # autograd is on: training stays exact
        layer(x).sum().backward()
        assert layer.weight.grad is not None
        with torch.no_grad():
            assert "mkldnn::_linear_pointwise" not in _ops(lambda: plain(x))
            assert "mkldnn::_linear_pointwise" not in _ops(lambda: double(x.double()))


@needs_onednn
@pytest.mark.parametrize("update", ["fused_adamw", "copy_", "new_storage"])
def test_a_changed_weight_is_repacked(update):
    """A fused optimizer step changes the weight without bumping its version counter: the value sample catches it."""
    torch.manual_seed(0)
    layer = _packed(Linear(13, 7))
    x = torch.randn(4, 13)
    with torch.no_grad(), packed_weights(layer):
        layer(x)
    if update == "fused_adamw":
        optimizer = torch.optim.AdamW(layer.parameters(), lr=0.5, fused=True)
        version = layer.weight._version
        layer(x).square().sum().backward()
        optimizer.step()
        assert layer.weight._version == version  # the case the value sample exists for
    elif update == "copy_":
        with torch.no_grad():
            layer.weight.copy_(torch.randn(7, 13))
    else:
        layer.weight = torch.nn.Parameter(torch.randn(7, 13))
    expected = torch.nn.functional.linear(x, layer.weight, layer.bias).detach()
    with torch.no_grad(), packed_weights(layer):
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-6)


@needs_onednn
def test_generate_is_unchanged_by_packing(every_row_count_packed):
    """Greedy and beam search with packed weights against the same model with packing switched off."""
    model = make_model(seed=3)
    src, mask = padded_batch()
    options = dict(max_new_tokens=8, output_scores=True, return_dict_in_generate=True)
    packed = [model.generate(src, attention_mask=mask, num_beams=b, **options) for b in (1, 3)]
    assert all(_PACKED.get(m) is not None for m in (model.lm_head, model.model.decoder.layers[0].fc1))
    assert _PACKED.get(model.model.encoder.layers[0].fc1) is None  # the encoder runs once per source: not packed
    model.set_cpu_weight_packing(False)
    assert _PACKED.get(model.lm_head) is None and not model.config.cpu_weight_packing
    plain = [model.generate(src, attention_mask=mask, num_beams=b, **options) for b in (1, 3)]
    for a, b in zip(packed, plain, strict=True):
        torch.testing.assert_close(a.sequences, b.sequences, rtol=0, atol=0)
        torch.testing.assert_close(torch.stack(a.scores), torch.stack(b.scores), rtol=1e-5, atol=1e-5)


@needs_onednn
def test_config_switch_reaches_every_decoder_projection():
    model = make_model(seed=3, cpu_weight_packing=False)
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert linears and not any(m.packed_inference for m in linears)
    model.set_cpu_weight_packing(True)
    decoder = {id(m) for m in model.model.decoder.modules()} | {id(model.lm_head)}
    assert all(m.packed_inference == (id(m) in decoder) for m in linears)


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_dropout_zeroes_a_fraction_p_and_rescales_the_rest(p):
    """Against the definition (§5.4) and torch's own dropout: same keep rate, same scaling, same gradient rule."""
    torch.manual_seed(0)
    x = torch.randn(256, 4096, requires_grad=True)
    y = dropout(x, p, training=True)
    kept = y != 0
    assert abs(1 - kept.float().mean().item() - p) < 0.003  # 1M draws: 4+ standard deviations
    reference = nn.functional.dropout(x, p, training=True) != 0
    assert abs(kept.float().mean().item() - reference.float().mean().item()) < 0.004
    realised = round(p * 32768) / 32768  # the 15-bit comparison's drop probability, p to within 2⁻¹⁶
    assert abs(realised - p) <= 2**-16
    torch.testing.assert_close(y[kept], x[kept] / (1 - realised))
    y.sum().backward()
    torch.testing.assert_close(x.grad, kept.float() / (1 - realised))
    assert dropout(x, p, training=False) is x and dropout(x, 0.0, training=True) is x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_keep_masks_are_independent_per_element_and_follow_the_seed(dtype):
    """Four mask elements share one 64-bit draw: neighbours must still be independent (no correlation between
    positions 4k..4k+3, nor across draws), any size works, the mask holds exactly 0 and 1 in x's dtype (for 16-bit
    floats it is written over the drawn words' bits), and the same seed gives the same mask."""
    torch.manual_seed(3)
    x = torch.empty(1_000_003, dtype=dtype)  # not a multiple of 4
    keep, realised = keep_mask(x, 0.1)
    assert keep.shape == x.shape and keep.dtype == dtype and realised == 3277 / 32768
    assert set(keep.unique().tolist()) == {0.0, 1.0}
    drop = (1 - keep[:1_000_000].double()).view(-1, 4)  # (words, lanes)
    assert torch.allclose(drop.mean(0), torch.full((4,), realised, dtype=drop.dtype), atol=0.003)  # every lane: p
    centred = drop - drop.mean()
    for a in range(4):
        for b in range(a + 1, 4):  # lanes of one draw, then the same lane of consecutive draws
            assert abs((centred[:, a] * centred[:, b]).mean().item()) < 0.0015  # p(1-p) = 0.09 if identical
        assert abs((centred[1:, a] * centred[:-1, a]).mean().item()) < 0.0015
    torch.manual_seed(3)
    assert torch.equal(keep_mask(x, 0.1)[0], keep)
    assert keep_mask(torch.empty(0), 0.1)[0].shape == (0,)
    assert keep_mask(torch.empty(3, 5, dtype=torch.bfloat16), 0.5)[0].shape == (3, 5)
    # The rate holds across p, 0 and the largest p below the fallback included.
    for p in (0.0, 0.05, 0.5, 0.9, 1 - 2**-14):
        drops = 1 - keep_mask(torch.empty(400_000, dtype=dtype), p)[0].double().mean().item()
        assert abs(drops - round(p * 32768) / 32768) < 0.004
    # Probabilities within 2⁻¹⁶ of 1 fall back to torch's dropout (all zeros at 1).
    assert torch.equal(dropout(torch.ones(7), 1.0, training=True), torch.zeros(7))


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_relu_dropout_is_dropout_of_relu_with_one_saved_tensor(dtype):
    """The fused FFN step against the two operations written out (same seed, so the same mask): the same output and
    the same gradient, including at x = 0 and where a positive input was dropped; only its output is saved for the
    backward; eval and p = 0 are the plain ReLU, and graph capture gets `nn.functional.dropout` of the ReLU."""
    x0 = torch.randn(64, 3, 333, dtype=dtype)
    x0[0, 0, :50] = 0.0
    grad = torch.randn_like(x0)
    torch.manual_seed(11)
    x = x0.clone().requires_grad_()
    y = relu_dropout(x, 0.2, training=True)
    y.backward(grad)
    torch.manual_seed(11)
    x_ref = x0.clone().requires_grad_()
    y_ref = dropout(torch.relu(x_ref), 0.2, training=True)
    y_ref.backward(grad)
    assert torch.equal(y, y_ref) and torch.equal(x.grad, x_ref.grad)
    dropped = (x0 > 0) & (y == 0)
    assert dropped.any() and not x.grad[dropped].any()
    assert abs(dropped.sum().item() / (x0 > 0).sum().item() - 0.2) < 0.01

    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = relu_dropout(x0.clone().requires_grad_(), 0.2, training=True)
    assert len(saved) == 1 and saved[0].data_ptr() == out.data_ptr()

    assert torch.equal(relu_dropout(x0, 0.2, training=False), torch.relu(x0))
    assert torch.equal(relu_dropout(x0, 0.0, training=True), torch.relu(x0))
    traced = torch.jit.trace(lambda t: relu_dropout(t, 0.5, training=True), x0.float(), check_trace=False)
    seen = {node.kind() for node in traced.graph.nodes()}
    assert "aten::dropout" in seen and "aten::relu" in seen


@pytest.mark.filterwarnings("ignore:`torch.jit.trace` is deprecated:DeprecationWarning")
def test_is_tracing_only_while_a_graph_is_captured():
    seen = []

    def probe(x):
        seen.append(is_tracing())
        return x + 1

    probe(torch.zeros(2))
    assert seen == [False]
    seen.clear()
    torch.compile(probe, fullgraph=True, backend="eager")(torch.zeros(2))
    assert seen and all(seen)
    seen.clear()
    torch.jit.trace(probe, torch.zeros(2), check_trace=False)
    assert seen == [True]


def test_attention_runs_in_fp32_under_cpu_autocast_and_is_a_pass_through_elsewhere():
    """Against torch's own scaled_dot_product_attention in fp32: under bf16 autocast a backend without a `math`
    formula (flex, flash, ...) gets fp32 inputs (and mask) with autocast off, and its output comes back in the
    queries' dtype."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(0)
    module = nn.Module()
    module.is_causal = False
    q, k, v = (torch.randn(2, 3, 5, 8) for _ in range(3))
    mask = torch.zeros(2, 1, 5, 5, dtype=torch.bfloat16)
    mask[..., -1] = torch.finfo(torch.bfloat16).min  # the last key is masked
    received = []

    def backend(module, query, key, value, attention_mask, **kwargs):
        received.append((query.dtype, key.dtype, value.dtype, attention_mask.dtype, torch.is_autocast_enabled("cpu")))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    expected = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask.float()).transpose(1, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output, _ = attention(backend, module, q.bfloat16(), k.bfloat16(), v.bfloat16(), mask, scaling=8**-0.5)
    assert received == [(torch.float32,) * 4 + (False,)] and output.dtype == torch.bfloat16
    bf16_inputs = [t.bfloat16().float() for t in (q, k, v)]
    oracle = nn.functional.scaled_dot_product_attention(*bf16_inputs, attn_mask=mask.float()).transpose(1, 2)
    torch.testing.assert_close(output, oracle.bfloat16())  # softmax(QKᵀ/√d_k)V of the bf16 inputs, in fp32
    received.clear()
    output, _ = attention(backend, module, q, k, v, mask.float(), scaling=8**-0.5)  # no autocast: called as it is
    assert received == [(torch.float32,) * 4 + (False,)]
    torch.testing.assert_close(output, expected)


def _bf16_oracle(q, k, v, **sdpa_kwargs):
    """softmax(QKᵀ/√d_k)V of the bf16-rounded inputs, by torch's own sdpa in fp32; (batch, tgt_len, heads, d_k)."""
    rounded = [t.bfloat16().float() for t in (q, k, v)]
    return nn.functional.scaled_dot_product_attention(*rounded, **sdpa_kwargs).transpose(1, 2)


@pytest.mark.parametrize("backend_name", ["sdpa", "eager"])
def test_attention_under_cpu_autocast_runs_the_math_formula_in_bf16(backend_name):
    """With `math` (the sdpa and eager backends), under bf16 autocast the formula runs in bf16 with the backend not
    called: the output is bf16 and within bf16 rounding of torch's fp32 sdpa on the same (bf16) inputs, padded keys
    get no weight, and gradients reach the queries, keys and values. The eager backend's weights come back; sdpa's
    contract has none."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from vanilla_transformer.model.attention import eager_attention_forward

    torch.manual_seed(0)
    module = nn.Module().train()
    module.is_causal = False
    q, k, v = (torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 8))
    allowed = torch.ones(2, 1, 5, 7, dtype=torch.bool)
    allowed[1, ..., 4:] = False  # the second row's last three keys are padding
    called = []
    backend = eager_attention_forward if backend_name == "eager" else sdpa_attention_forward

    def spy(*args, **kwargs):
        called.append(True)
        return backend(*args, **kwargs)

    leaves = [t.bfloat16().requires_grad_() for t in (q, k, v)]
    interface = eager_attention_forward if backend_name == "eager" else spy
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output, weights = attention(
            interface, module, *leaves, allowed, math=eager_attention_forward, scaling=8**-0.5, dropout=0.0
        )
    assert not called and output.dtype == torch.bfloat16
    torch.testing.assert_close(output.float(), _bf16_oracle(q, k, v, attn_mask=allowed), atol=3e-2, rtol=2e-2)
    if backend_name == "eager":
        assert weights.shape == (2, 3, 5, 7) and torch.all(weights[1, ..., 4:] == 0)
    else:
        assert weights is None
    output.float().sum().backward()
    assert all(leaf.grad is not None and torch.isfinite(leaf.grad).all() for leaf in leaves)
    assert torch.all(leaves[1].grad[1, :, 4:] == 0) and torch.all(leaves[2].grad[1, :, 4:] == 0)  # padding: no grad


@pytest.mark.parametrize(("tgt_len", "src_len"), [(6, 6), (2, 6), (1, 6)])
def test_attention_under_cpu_autocast_builds_sdpas_causal_mask(tgt_len, src_len):
    """Where transformers' sdpa backend would take `is_causal` (no mask, a causal module, more than one query), the
    bf16 formula gets the causal mask: query i sees keys up to src_len - tgt_len + i (a cached past of
    src_len - tgt_len positions), as sdpa's own causal attention over the same queries and keys does; one query
    sees every key. A module that is not causal attends everywhere."""
    from vanilla_transformer.model.attention import eager_attention_forward

    torch.manual_seed(1)
    causal, bidirectional = nn.Module(), nn.Module()
    causal.is_causal, bidirectional.is_causal = True, False
    q, k, v = torch.randn(2, 4, tgt_len, 8), torch.randn(2, 4, src_len, 8), torch.randn(2, 4, src_len, 8)
    sees = torch.ones(tgt_len, src_len, dtype=torch.bool).tril(src_len - tgt_len)
    for module, mask in ((causal, sees), (bidirectional, None)):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output, _ = attention(
                eager_attention_forward, module, q.bfloat16(), k.bfloat16(), v.bfloat16(), None,
                math=eager_attention_forward, scaling=8**-0.5,
            )  # fmt: skip
        expected = _bf16_oracle(q, k, v, attn_mask=mask)
        torch.testing.assert_close(output.float(), expected, atol=3e-2, rtol=2e-2)
    if tgt_len == src_len:  # sdpa's own is_causal (top-left aligned) is the same mask when the lengths are equal
        torch.testing.assert_close(_bf16_oracle(q, k, v, is_causal=True), _bf16_oracle(q, k, v, attn_mask=sees))


def test_model_under_cpu_autocast_scores_alike_with_sdpa_and_eager_and_near_fp32():
    """A whole training forward with padding (encoder), a causal decoder and ignored labels: under bf16 autocast the
    sdpa and eager configurations compute the same loss (both run the bf16 formula), within bf16 rounding of the
    fp32 loss, and the gradients agree with fp32's in direction."""
    model = make_model(seed=3).train()
    ids, mask = padded_batch(seed=4, batch=3, src_len=9)
    labels, _ = padded_batch(seed=5, batch=3, src_len=7)
    labels[labels == 0] = -100
    config = model.config
    config.dropout = config.attention_dropout = config.activation_dropout = 0.0  # compare the math, not the masks
    losses, grads = {}, {}
    for name, implementation, bf16 in (("fp32", "sdpa", False), ("sdpa", "sdpa", True), ("eager", "eager", True)):
        model.set_attn_implementation(implementation)
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        losses[name] = loss.item()
        grads[name] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    assert losses["sdpa"] == losses["eager"]
    assert abs(losses["sdpa"] - losses["fp32"]) < 2e-2 * abs(losses["fp32"])
    cosine = nn.functional.cosine_similarity(grads["sdpa"], grads["fp32"], dim=0)
    assert cosine > 0.99, cosine


def test_model_under_cpu_autocast_never_calls_the_sdpa_backend(monkeypatch):
    """With `attn_implementation="sdpa"`, every self- and cross-attention of a forward under CPU bf16 autocast runs
    the bf16 formula (short keys): transformers' sdpa backend is never called. Without autocast the same model calls
    it once per attention with fp32 inputs, which shows the spy sits where the model dispatches."""
    from transformers.integrations import sdpa_attention
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    model = make_model(seed=0)
    model.set_attn_implementation("sdpa")
    ids, mask = padded_batch()
    seen = []

    def spy(module, query, key, value, attention_mask, **kwargs):
        seen.append((query.dtype, torch.is_autocast_enabled("cpu")))
        return sdpa_attention.sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "sdpa", spy)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :5])
    assert seen == []
    model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :5])
    calls = model.config.encoder_layers + 2 * model.config.decoder_layers  # self- and cross-attention
    assert seen == [(torch.float32, False)] * calls


def test_attention_under_cpu_autocast_leaves_long_keys_to_the_backend_in_fp32():
    """Beyond `MATH_ATTENTION_MAX_KEYS` keys the bf16 formula is not used (the fp32 kernel is as fast there and never
    holds the weights): the backend gets fp32 inputs with autocast off, as for a backend without a formula."""
    from vanilla_transformer.model.attention import eager_attention_forward
    from vanilla_transformer.model.kernels import MATH_ATTENTION_MAX_KEYS

    module = nn.Module()
    module.is_causal = False
    received = []

    def backend(module, query, key, value, attention_mask, **kwargs):
        received.append((query.dtype, key.shape[2], torch.is_autocast_enabled("cpu")))
        return eager_attention_forward(module, query, key, value, attention_mask, **kwargs)

    for keys in (MATH_ATTENTION_MAX_KEYS, MATH_ATTENTION_MAX_KEYS + 1):
        q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, keys, 8), torch.randn(1, 2, keys, 8)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output, _ = attention(
                backend, module, q.bfloat16(), k.bfloat16(), v.bfloat16(), None,
                math=eager_attention_forward, scaling=8**-0.5,
            )  # fmt: skip
        assert output.dtype == torch.bfloat16
        torch.testing.assert_close(output.float(), _bf16_oracle(q, k, v), atol=3e-2, rtol=2e-2)
    assert received == [(torch.float32, MATH_ATTENTION_MAX_KEYS + 1, False)]


def test_the_output_loss_is_fused_only_for_a_plain_hookless_fp32_cpu_linear():
    head, hidden = Linear(8, 11, bias=False), torch.randn(3, 8)
    assert fuses_output_loss(head, hidden)
    assert not fuses_output_loss(head, hidden.double())
    assert not fuses_output_loss(Linear(8, 11), hidden)  # a bias of its own
    assert not fuses_output_loss(nn.Linear(8, 11, bias=False), hidden)  # not this package's module (PEFT, ...)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not fuses_output_loss(head, hidden)
    for register in (head.register_forward_hook, head.register_forward_pre_hook):
        handle = register(lambda *args: None)
        assert not fuses_output_loss(head, hidden)
        handle.remove()
    handle = nn.modules.module.register_module_forward_pre_hook(lambda *args: None)
    try:
        assert not fuses_output_loss(head, hidden)
    finally:
        handle.remove()
    assert fuses_output_loss(head, hidden)
