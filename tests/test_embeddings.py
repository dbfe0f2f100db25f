import math

import pytest
import torch

from vanilla_transformer import SinusoidalPositionalEncoding, sinusoidal_positional_encoding
from vanilla_transformer.model.embeddings import InputRepresentation

from .conftest import closed_form_pe, make_model


@pytest.mark.parametrize("pos, i", [(0, 0), (1, 0), (3, 2), (17, 5), (250, 7), (5000, 1)])
def test_pe_equals_closed_form(pos, i):
    d_model = 16
    pe = sinusoidal_positional_encoding(torch.tensor([pos]), d_model)[0]
    angle = pos / 10000 ** (2 * i / d_model)
    torch.testing.assert_close(pe[2 * i].item(), math.sin(angle), atol=2e-4, rtol=0)
    torch.testing.assert_close(pe[2 * i + 1].item(), math.cos(angle), atol=2e-4, rtol=0)


def test_pe_interleaves_sin_and_cos():
    pe = SinusoidalPositionalEncoding(8)(seq_len=3)
    assert pe.shape == (3, 8)
    assert torch.all(pe[0, 0::2] == 0) and torch.all(pe[0, 1::2] == 1)  # sin(0) on even dims, cos(0) on odd


def test_pe_offset_continues_positions():
    module = SinusoidalPositionalEncoding(12)
    torch.testing.assert_close(module(seq_len=3, offset=5), module(seq_len=8)[5:])


def test_pe_table_equals_closed_form_as_it_grows():
    module = SinusoidalPositionalEncoding(16)
    first = module(seq_len=4, offset=250)  # inside the first table
    grown = module(seq_len=10, offset=300)  # beyond it: the table doubles
    torch.testing.assert_close(first, sinusoidal_positional_encoding(torch.arange(250, 254), 16))
    torch.testing.assert_close(grown, sinusoidal_positional_encoding(torch.arange(300, 310), 16))
    torch.testing.assert_close(module(seq_len=3, offset=torch.tensor(300)), grown[:3])  # tensor offset: closed form
    assert not module.state_dict()


def test_pe_rejects_odd_width():
    with pytest.raises(ValueError, match="even"):
        sinusoidal_positional_encoding(torch.arange(3), 7)


def test_stack_input_is_scaled_embedding_plus_pe_beyond_max_positions():
    """§3.4/3.5: the first encoder layer sees E[x]·√d_model + PE, also past max_position_embeddings (12 here)."""
    model = make_model()
    ids = torch.randint(4, 37, (2, 20))
    seen = {}
    model.model.encoder.layers[0].register_forward_pre_hook(lambda m, args: seen.setdefault("x", args[0]))
    model.model.encoder(input_ids=ids)
    d_model = model.config.d_model
    expected = model.model.shared.weight[ids] * math.sqrt(d_model)
    expected = expected + closed_form_pe(20, d_model)
    torch.testing.assert_close(seen["x"], expected, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("scale_embedding, scale", [(True, 4.0), (False, 1.0)])
def test_input_representation_is_scaled_embedding_plus_pe_then_dropout(scale_embedding, scale):
    """§3.4/3.5/5.4: E[x]·√d_model (√16 = 4) + PE of positions offset, offset + 1, ..., dropout only in training."""
    module = InputRepresentation(16, scale_embedding=scale_embedding, dropout=0.5).eval()
    embeds = torch.randn(2, 5, 16)
    expected = embeds * scale + closed_form_pe(8, 16)[3:]
    torch.testing.assert_close(module(embeds, offset=3), expected, atol=1e-4, rtol=1e-5)
    assert not module.state_dict() and not list(module.parameters())
    module.train()
    dropped = module(embeds, offset=3)
    kept = dropped != 0
    assert not kept.all() and kept.any()
    torch.testing.assert_close(dropped[kept], expected[kept] * 2, atol=1e-4, rtol=1e-5)
