"""The layers (§3.1, §3.3): parity against torch's own post-LN (and pre-LN) Transformer layers with copied weights, and
the residual and feed-forward blocks they are built from."""

import copy

import pytest
import torch
from torch import nn

from vanilla_transformer.model.layers import DecoderLayer, EncoderLayer, PositionwiseFeedForward, ResidualLayerNorm

from .conftest import make_config


def copy_attention(theirs: nn.MultiheadAttention, ours) -> None:
    theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
    theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
    theirs.out_proj.weight.copy_(ours.out_proj.weight)
    theirs.out_proj.bias.copy_(ours.out_proj.bias)


def copy_linear_and_norm(dst: nn.Module, src: nn.Module) -> None:
    dst.weight.copy_(src.weight)
    dst.bias.copy_(src.bias)


def torch_encoder_layer(ours: EncoderLayer, config) -> nn.TransformerEncoderLayer:
    theirs = nn.TransformerEncoderLayer(
        config.d_model, config.encoder_attention_heads, config.encoder_ffn_dim, dropout=0.0, activation="relu",
        layer_norm_eps=config.layer_norm_eps, batch_first=True, norm_first=config.normalize_before,
    ).eval()  # fmt: skip
    with torch.no_grad():
        copy_attention(theirs.self_attn, ours.self_attn)
        pairs = [(theirs.linear1, ours.fc1), (theirs.linear2, ours.fc2)]
        pairs += [(theirs.norm1, ours.self_attn_layer_norm), (theirs.norm2, ours.final_layer_norm)]
        for dst, src in pairs:
            copy_linear_and_norm(dst, src)
    return theirs


def torch_decoder_layer(ours: DecoderLayer, config) -> nn.TransformerDecoderLayer:
    theirs = nn.TransformerDecoderLayer(
        config.d_model, config.decoder_attention_heads, config.decoder_ffn_dim, dropout=0.0, activation="relu",
        layer_norm_eps=config.layer_norm_eps, batch_first=True, norm_first=config.normalize_before,
    ).eval()  # fmt: skip
    with torch.no_grad():
        copy_attention(theirs.self_attn, ours.self_attn)
        copy_attention(theirs.multihead_attn, ours.encoder_attn)
        pairs = [(theirs.linear1, ours.fc1), (theirs.linear2, ours.fc2), (theirs.norm1, ours.self_attn_layer_norm)]
        pairs += [(theirs.norm2, ours.encoder_attn_layer_norm), (theirs.norm3, ours.final_layer_norm)]
        for dst, src in pairs:
            copy_linear_and_norm(dst, src)
    return theirs


def randomize_norms(module: nn.Module) -> None:
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.5, 0.5)


@pytest.mark.parametrize("normalize_before", [False, True])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_encoder_layer_matches_torch(normalize_before, implementation):
    config = make_config(normalize_before=normalize_before)
    config._attn_implementation = implementation
    torch.manual_seed(0)
    ours = EncoderLayer(config).eval()
    randomize_norms(ours)
    theirs = torch_encoder_layer(ours, config)
    x = torch.randn(2, 6, 16)
    padding = torch.zeros(2, 6, dtype=torch.bool)
    padding[0, 4:] = True
    out = ours(x, (~padding)[:, None, None, :])
    expected = theirs(x, src_key_padding_mask=padding)
    torch.testing.assert_close(out[~padding], expected[~padding], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("normalize_before", [False, True])
def test_decoder_layer_matches_torch(normalize_before):
    config = make_config(normalize_before=normalize_before)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    ours = DecoderLayer(config, layer_idx=0).eval()
    randomize_norms(ours)
    theirs = torch_decoder_layer(ours, config)
    y, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    memory_padding = torch.zeros(2, 7, dtype=torch.bool)
    memory_padding[1, 3:] = True
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    out = ours(y, causal[None, None], memory, encoder_attention_mask=(~memory_padding)[:, None, None, :], cache=None)
    expected = theirs(y, memory, tgt_mask=~causal, memory_key_padding_mask=memory_padding)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)


def test_post_ln_output_is_normalized():
    """Post-LN: every layer output is a LayerNorm output (zero mean, unit variance with default affine)."""
    config = make_config()
    config._attn_implementation = "eager"
    out = EncoderLayer(config).eval()(torch.randn(2, 4, 16) * 5)
    torch.testing.assert_close(out.mean(-1), torch.zeros(2, 4), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.var(-1, unbiased=False), torch.ones(2, 4), atol=1e-3, rtol=0)


def test_dropout_active_only_in_training():
    config = make_config(dropout=0.5)
    config._attn_implementation = "eager"
    layer = EncoderLayer(config)
    x = torch.randn(2, 4, 16)
    layer.eval()
    torch.testing.assert_close(layer(x), layer(x))
    layer.train()
    assert not torch.allclose(layer(x), layer(x))


@pytest.mark.parametrize("normalize_before", [False, True])
def test_residual_layer_norm_wraps_its_sublayer(normalize_before):
    """§3.1: LayerNorm(x + Sublayer(x)) (post-LN), or x + Sublayer(LayerNorm(x)) (pre-LN); its keys are LayerNorm's."""
    torch.manual_seed(0)
    norm = ResidualLayerNorm(16, eps=1e-5, dropout=0.0, normalize_before=normalize_before)
    randomize_norms(norm)
    assert isinstance(norm, nn.LayerNorm) and list(norm.state_dict()) == ["weight", "bias"]
    sublayer = nn.Linear(16, 16)
    x = torch.randn(2, 5, 16)

    def layer_norm(h):
        return nn.functional.layer_norm(h, (16,), norm.weight, norm.bias, 1e-5)

    expected = x + sublayer(layer_norm(x)) if normalize_before else layer_norm(x + sublayer(x))
    torch.testing.assert_close(norm(x, sublayer), expected)


def test_feed_forward_is_relu_between_the_layers_projections():
    """§3.3: FFN(x) = max(0, x W1 + b1) W2 + b2 with the layer's own `fc1`/`fc2`, looked up at each call."""
    config = make_config()
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    layer = EncoderLayer(config).eval()
    assert isinstance(layer.feed_forward, PositionwiseFeedForward) and not list(layer.feed_forward.parameters())
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(layer.ffn(x), layer.fc2(torch.relu(layer.fc1(x))))

    twin = copy.deepcopy(layer)  # the copy computes with its own projections
    with torch.no_grad():
        twin.fc1.weight.mul_(2)
    torch.testing.assert_close(twin.ffn(x), twin.fc2(torch.relu(twin.fc1(x))))
    assert not torch.allclose(twin.ffn(x), layer.ffn(x))

    layer.fc2 = nn.Linear(24, 16)  # a replaced module (as quantization or adapters do) is the one used
    torch.testing.assert_close(layer.ffn(x), layer.fc2(torch.relu(layer.fc1(x))))
    layer.double()
    assert layer(x.double()).dtype == torch.float64
