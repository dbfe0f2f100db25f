import pytest
import torch
from torch import nn

from vanilla_transformer.model.attention import MultiHeadAttention, eager_attention_forward

from .conftest import make_config


def test_eager_attention_matches_torch_sdpa_with_mask():
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(2, 3, 5, 4, generator=g),
        torch.randn(2, 3, 7, 4, generator=g),
        torch.randn(2, 3, 7, 4, generator=g),
    )
    allowed = torch.rand(2, 1, 5, 7, generator=g) > 0.3
    allowed[..., 0] = True
    module = nn.Module().eval()
    out, weights = eager_attention_forward(module, q, k, v, allowed, scaling=0.5)
    expected = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    torch.testing.assert_close(out, expected.transpose(1, 2))
    assert torch.all(weights.masked_select(~allowed.expand_as(weights)) == 0)  # masked keys get zero weight
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 5))


def test_eager_attention_hand_computed():
    q = torch.tensor([[[[1.0, 0.0]]]])  # (1, 1, 1, 2)
    k = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])
    v = torch.tensor([[[[10.0, 0.0], [0.0, 10.0]]]])
    out, weights = eager_attention_forward(nn.Module(), q, k, v, None, scaling=2**-0.5)
    p = torch.softmax(torch.tensor([2**-0.5, 0.0]), 0)
    torch.testing.assert_close(weights[0, 0, 0], p)
    torch.testing.assert_close(out[0, 0, 0], 10 * p)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_multi_head_attention_matches_torch_multihead_attention(implementation):
    config = make_config()
    config._attn_implementation = implementation
    torch.manual_seed(0)
    ours = MultiHeadAttention(config, d_model=16, num_heads=4).eval()
    theirs = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        theirs.out_proj.weight.copy_(ours.out_proj.weight)
        theirs.out_proj.bias.copy_(ours.out_proj.bias)
    x = torch.randn(2, 5, 16)
    memory = torch.randn(2, 7, 16)
    padding = torch.zeros(2, 7, dtype=torch.bool)
    padding[1, 4:] = True  # True = padding, torch's convention
    allowed = (~padding)[:, None, None, :]  # (batch, 1, 1, src_len), True = attend
    out, _ = ours(x, key_value_states=memory, attention_mask=allowed)
    expected, _ = theirs(x, memory, memory, key_padding_mask=padding)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)


def test_head_count_must_divide_width():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(make_config(), d_model=16, num_heads=3)
