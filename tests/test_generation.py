"""generate() and the KV cache: cached decoding must equal uncached decoding and a hand-written loop."""

import pytest
import torch
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

from .conftest import make_model, padded_batch

GEN = dict(max_new_tokens=8, min_new_tokens=8)  # fixed length: random weights rarely emit </s>


def generate_both(model, **kwargs):
    src, mask = padded_batch()
    outs = [
        model.generate(src, attention_mask=mask, use_cache=use_cache, return_dict_in_generate=True, **GEN, **kwargs)
        for use_cache in (True, False)
    ]
    return outs


def test_greedy_equals_hand_loop_and_uncached():
    model = make_model(seed=1)
    src, mask = padded_batch()
    cached, uncached = generate_both(model, output_scores=True)
    assert torch.equal(cached.sequences, uncached.sequences)
    for a, b in zip(cached.scores, uncached.scores, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)

    # Oracle: argmax of full (uncached) forward passes, one token at a time.
    ys = torch.full((3, 1), model.config.decoder_start_token_id)
    with torch.no_grad():
        for _ in range(8):
            logits = model(input_ids=src, attention_mask=mask, decoder_input_ids=ys, use_cache=False).logits
            logits[:, -1, model.config.eos_token_id] = -float("inf")  # what min_new_tokens does
            ys = torch.cat([ys, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(cached.sequences, ys)


def test_beam_search_with_length_penalty_cached_equals_uncached():
    model = make_model(seed=2)
    cached, uncached = generate_both(model, num_beams=4, num_return_sequences=2, length_penalty=0.6)
    assert torch.equal(cached.sequences, uncached.sequences)
    torch.testing.assert_close(cached.sequences_scores, uncached.sequences_scores, atol=1e-5, rtol=1e-5)


def test_beam_reorder_leaves_cross_attention_cache_and_matches_full_reorder(monkeypatch):
    model = make_model(seed=2)
    src, mask = padded_batch()
    kwargs = dict(attention_mask=mask, num_beams=4, num_return_sequences=2, return_dict_in_generate=True, **GEN)
    ours = model.generate(src, **kwargs)
    # transformers' default: EncoderDecoderCache.reorder_cache gathers the cross-attention keys/values too
    monkeypatch.delattr(type(model), "_reorder_cache")
    full = model.generate(src, **kwargs)
    assert torch.equal(ours.sequences, full.sequences)
    torch.testing.assert_close(ours.sequences_scores, full.sequences_scores, atol=0, rtol=0)


def test_sampling_cached_equals_uncached():
    model = make_model(seed=3)
    src, mask = padded_batch()
    outs = []
    for use_cache in (True, False):
        torch.manual_seed(123)
        outs.append(model.generate(src, attention_mask=mask, do_sample=True, top_k=10, use_cache=use_cache, **GEN))
    assert torch.equal(outs[0], outs[1])


def test_token_by_token_equals_full_forward():
    model = make_model(seed=4)
    src, mask = padded_batch()
    tgt = torch.randint(4, 37, (3, 7))
    with torch.no_grad():
        full = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt, use_cache=False).logits
        encoder_outputs = model.get_encoder()(input_ids=src, attention_mask=mask)
        cache, steps = None, []
        for t in range(7):
            out = model(
                encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=tgt[:, t : t + 1],
                cache=cache, use_cache=True,
            )  # fmt: skip
            cache = out.cache
            steps.append(out.logits)
    assert isinstance(cache, EncoderDecoderCache)
    assert cache.get_seq_length() == 7
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_several_new_tokens_on_a_cache():
    model = make_model(seed=4)
    src, mask = padded_batch()
    tgt = torch.randint(4, 37, (3, 7))
    with torch.no_grad():
        full = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        first = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt[:, :3], use_cache=True)
        rest = model(
            encoder_outputs=(first.encoder_last_hidden_state,), attention_mask=mask, decoder_input_ids=tgt[:, 3:],
            cache=first.cache,
        )  # fmt: skip
    torch.testing.assert_close(rest.logits, full[:, 3:], atol=1e-5, rtol=1e-5)


def test_cross_attention_keys_values_are_projected_once():
    model = make_model(seed=5)
    calls = []
    model.model.decoder.layers[0].encoder_attn.k_proj.register_forward_hook(lambda *a: calls.append(1))
    src, mask = padded_batch()
    model.generate(src, attention_mask=mask, **GEN)
    assert len(calls) == 1
    calls.clear()
    model.generate(src, attention_mask=mask, use_cache=False, **GEN)
    assert len(calls) == 8


def test_past_key_values_is_a_deprecated_alias_of_cache():
    model = make_model(seed=6)
    src, mask = padded_batch()
    tgt = torch.randint(4, 37, (3, 4))
    with torch.no_grad():
        first = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt[:, :3], use_cache=True)
        expected = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits[:, 3:]
        with pytest.warns(FutureWarning, match="past_key_values"):
            out = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt[:, 3:], past_key_values=first.cache)
    torch.testing.assert_close(out.logits, expected, atol=1e-5, rtol=1e-5)
    assert out.past_key_values is out.cache


def test_cache_can_be_rebuilt_from_tensors():
    """The one conversion transformers 5.24 keeps: EncoderDecoderCache from (self_k, self_v, cross_k, cross_v)."""
    model = make_model(seed=7)
    src, mask = padded_batch()
    tgt = torch.randint(4, 37, (3, 5))
    with torch.no_grad():
        first = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt[:, :4], use_cache=True)
        c = first.cache
        layers = [
            (s.keys, s.values, x.keys, x.values)
            for s, x in zip(c.self_attention_cache.layers, c.cross_attention_cache.layers, strict=True)
        ]
        rebuilt = EncoderDecoderCache(layers)
        out = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt[:, 4:], cache=rebuilt)
        expected = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits[:, 4:]
    torch.testing.assert_close(out.logits, expected, atol=1e-5, rtol=1e-5)
    assert isinstance(rebuilt.self_attention_cache, DynamicCache)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_static_cache_equals_dynamic_cache(num_beams):
    model = make_model(seed=8)
    src, mask = padded_batch()
    kwargs = dict(attention_mask=mask, num_beams=num_beams, **GEN)
    dynamic = model.generate(src, **kwargs)
    static = model.generate(src, cache_implementation="static", **kwargs)
    assert torch.equal(dynamic, static)


def test_generation_beyond_max_position_embeddings():
    model = make_model(seed=9)  # max_position_embeddings = 12
    src = torch.randint(4, 37, (1, 30))
    cached = model.generate(src, max_new_tokens=20, min_new_tokens=20)
    uncached = model.generate(src, max_new_tokens=20, min_new_tokens=20, use_cache=False)
    assert cached.shape == (1, 21) and torch.equal(cached, uncached)


def test_torch_compile_fullgraph():
    model = make_model(seed=10)
    src, mask = padded_batch()
    tgt = torch.randint(4, 37, (3, 5))
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    with torch.no_grad():
        expected = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        got = compiled(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
    torch.testing.assert_close(got, expected)
    loss = compiled(input_ids=src, attention_mask=mask, labels=tgt).loss  # training graph too
    loss.backward()
    assert model.model.shared.weight.grad is not None


@pytest.mark.slow
def test_torch_compile_inductor_matches_eager():
    model = make_model(seed=11)
    src, mask = padded_batch()
    tgt = torch.randint(4, 37, (3, 5))
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        expected = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        got = compiled(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_decoder_mask_over_new_tokens_only_keeps_the_cache_visible():
    model = make_model(seed=12)
    src, mask = padded_batch()
    tgt = torch.randint(4, 37, (3, 5))
    with torch.no_grad():
        first = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt[:, :3], use_cache=True)
        short = model(
            input_ids=src, attention_mask=mask, decoder_input_ids=tgt[:, 3:], cache=first.cache,
            decoder_attention_mask=torch.ones(3, 2, dtype=torch.long),
        )  # fmt: skip
        expected = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits[:, 3:]
    torch.testing.assert_close(short.logits, expected, atol=1e-5, rtol=1e-5)
