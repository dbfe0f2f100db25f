import inspect
import math
import re
import typing

import pytest
import torch
from safetensors import safe_open
from torch import nn
from transformers import AutoModel, AutoModelForSeq2SeqLM
from transformers.utils import TransformersKwargs

from vanilla_transformer import (
    VanillaTransformerConfig,
    VanillaTransformerDecoder,
    VanillaTransformerEncoder,
    VanillaTransformerForConditionalGeneration,
    VanillaTransformerModel,
    shift_tokens_right,
)
from vanilla_transformer.model.layers import DecoderLayer, EncoderLayer

from .conftest import closed_form_pe, make_model, padded_batch
from .test_layers import randomize_norms, torch_decoder_layer, torch_encoder_layer


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_model_matches_torch_transformer_stacks(implementation):
    """The whole computation against an independent oracle: torch's own encoder/decoder stacks (copied weights),
    embeddings × √d_model + closed-form PE, and the shared matrix as pre-softmax projection."""
    model = make_model(seed=3)
    randomize_norms(model)
    model.set_attn_implementation(implementation)
    config = model.config
    encoder = nn.ModuleList([torch_encoder_layer(layer, config) for layer in model.model.encoder.layers])
    decoder = nn.ModuleList([torch_decoder_layer(layer, config) for layer in model.model.decoder.layers])
    src, src_mask = padded_batch(batch=3, src_len=9)
    tgt = torch.randint(4, 37, (3, 6))
    emb, d = model.model.shared.weight, config.d_model

    with torch.no_grad():
        memory = emb[src] * math.sqrt(d) + closed_form_pe(9, d)
        for layer in encoder:
            memory = layer(memory, src_key_padding_mask=src_mask == 0)
        y = emb[tgt] * math.sqrt(d) + closed_form_pe(6, d)
        causal = nn.Transformer.generate_square_subsequent_mask(6)
        for layer in decoder:
            y = layer(y, memory, tgt_mask=causal, memory_key_padding_mask=src_mask == 0)
        expected = y @ emb.T

        logits = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("preset, expected", [("base", 63_082_496), ("big", 214_245_376)])
def test_parameter_counts_of_table_3(preset, expected):
    config = VanillaTransformerConfig.from_preset(preset, vocab_size=37000)
    with torch.device("meta"):
        model = VanillaTransformerForConditionalGeneration(config)
    assert sum(p.numel() for p in model.parameters()) == expected


def test_state_dict_names_and_shared_matrix_saved_once(tmp_path):
    model = make_model()
    names = set(model.state_dict())
    for name in [
        "model.shared.weight",
        "model.encoder.embed_tokens.weight",
        "model.decoder.embed_tokens.weight",
        "lm_head.weight",
        "model.encoder.layers.1.self_attn.q_proj.weight",
        "model.encoder.layers.0.self_attn.out_proj.bias",
        "model.decoder.layers.2.self_attn.k_proj.weight",
        "model.decoder.layers.2.encoder_attn.v_proj.weight",
        "model.decoder.layers.0.encoder_attn_layer_norm.weight",
        "model.encoder.layers.0.self_attn_layer_norm.bias",
        "model.decoder.layers.1.final_layer_norm.weight",
        "model.encoder.layers.1.fc1.weight",
        "model.decoder.layers.0.fc2.bias",
    ]:
        assert name in names, name
    assert not any("embed_positions" in n for n in names)  # the sinusoid has no parameters or buffers
    shared = model.model.shared.weight
    assert model.lm_head.weight is shared
    assert model.model.encoder.embed_tokens.weight is shared and model.model.decoder.embed_tokens.weight is shared

    model.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        saved = set(f.keys())
    assert "model.shared.weight" in saved
    assert not {"lm_head.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"} & saved


ATTENTION_KEYS = [f"{proj}.{p}" for proj in ("q_proj", "k_proj", "v_proj", "out_proj") for p in ("weight", "bias")]
NORM_KEYS = ["weight", "bias"]


def expected_layer_keys(prefix: str, cross_attention: bool) -> list[str]:
    """A layer's keys in registration order: self_attn, its norm, [encoder_attn, its norm], fc1, fc2, final norm."""
    blocks = [("self_attn", ATTENTION_KEYS), ("self_attn_layer_norm", NORM_KEYS)]
    if cross_attention:
        blocks += [("encoder_attn", ATTENTION_KEYS), ("encoder_attn_layer_norm", NORM_KEYS)]
    blocks += [("fc1", NORM_KEYS), ("fc2", NORM_KEYS), ("final_layer_norm", NORM_KEYS)]
    return [f"{prefix}.{name}.{key}" for name, keys in blocks for key in keys]


def expected_state_dict_keys(encoder_layers: int, decoder_layers: int, shared=True, pre_ln=False, logits_bias=False):
    keys = ["final_logits_bias"] if logits_bias else []  # the head's own buffer comes before its children
    keys += ["model.shared.weight"] if shared else []
    for stack, count in (("encoder", encoder_layers), ("decoder", decoder_layers)):
        keys.append(f"model.{stack}.embed_tokens.weight")
        for i in range(count):
            keys += expected_layer_keys(f"model.{stack}.layers.{i}", cross_attention=stack == "decoder")
        if pre_ln:
            keys += [f"model.{stack}.layer_norm.weight", f"model.{stack}.layer_norm.bias"]
    return keys + ["lm_head.weight"]


def test_state_dict_keys_are_pinned():
    """The full, ordered key list is a public contract (checkpoints, converters, exporters): any change fails here."""
    assert list(make_model().state_dict()) == expected_state_dict_keys(2, 3)
    base_keys = [k.removeprefix("model.") for k in expected_state_dict_keys(2, 3)[:-1]]
    assert list(make_model().model.state_dict()) == base_keys
    unshared = dict(share_encoder_decoder_embeddings=False, decoder_vocab_size=41)
    variant = make_model(normalize_before=True, add_final_logits_bias=True, **unshared)
    assert list(variant.state_dict()) == expected_state_dict_keys(2, 3, shared=False, pre_ln=True, logits_bias=True)
    assert make_model().all_tied_weights_keys == {
        "lm_head.weight": "model.shared.weight",
        "model.encoder.embed_tokens.weight": "model.shared.weight",
        "model.decoder.embed_tokens.weight": "model.shared.weight",
    }
    assert variant.all_tied_weights_keys == {"lm_head.weight": "model.decoder.embed_tokens.weight"}


def test_untied_embeddings_are_separate(tmp_path):
    model = make_model(tie_word_embeddings=False)
    assert model.lm_head.weight is not model.model.shared.weight
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(4, 37, (2, 5))
    torch.testing.assert_close(
        reloaded(input_ids=ids, decoder_input_ids=ids).logits, model(input_ids=ids, decoder_input_ids=ids).logits
    )


def test_save_and_reload_through_auto_classes(tmp_path):
    model = make_model()
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert type(reloaded) is VanillaTransformerForConditionalGeneration
    assert reloaded.lm_head.weight is reloaded.model.shared.weight
    src, mask = padded_batch()
    tgt = torch.randint(4, 37, (3, 4))
    torch.testing.assert_close(
        reloaded(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits,
        model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits,
    )
    base = AutoModel.from_pretrained(tmp_path)
    assert type(base) is VanillaTransformerModel
    torch.testing.assert_close(base.shared.weight, model.model.shared.weight)


def test_resize_token_embeddings_resizes_the_final_logits_bias(tmp_path):
    """Marian-style models add a bias to the logits: it follows the vocabulary when tokens are added or removed."""
    model = make_model(add_final_logits_bias=True)
    model.final_logits_bias.normal_()
    src, mask = padded_batch()
    tgt = torch.randint(4, 37, (3, 4))
    before = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits  # (3, 4, 37)
    bias = model.final_logits_bias.clone()
    model.resize_token_embeddings(45)
    after = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
    assert after.shape == (3, 4, 45) and model.final_logits_bias.shape == (1, 45)
    torch.testing.assert_close(after[..., :37], before)  # the old tokens score as before
    assert torch.equal(model.final_logits_bias[:, :37], bias) and not model.final_logits_bias[:, 37:].any()
    model.resize_token_embeddings(30)
    assert torch.equal(model.final_logits_bias, bias[:, :30])
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    assert torch.equal(reloaded.final_logits_bias, bias[:, :30]) and reloaded.config.vocab_size == 30
    plain = make_model()  # shared embeddings without a bias: the saved config still loads
    plain.resize_token_embeddings(40)
    plain.save_pretrained(tmp_path / "plain")
    assert AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "plain").lm_head.weight.shape == (40, 16)


def test_loss_ignores_minus_100_and_honours_num_items_in_batch():
    model = make_model()
    src, mask = padded_batch()
    labels = torch.randint(4, 37, (3, 5))
    labels[1, 3:] = -100
    labels[2, 2:] = -100
    out = model(input_ids=src, attention_mask=mask, labels=labels)
    keep = labels != -100
    expected = nn.functional.cross_entropy(out.logits[keep], labels[keep])
    torch.testing.assert_close(out.loss, expected)
    out_sum = model(input_ids=src, attention_mask=mask, labels=labels, num_items_in_batch=20)
    torch.testing.assert_close(out_sum.loss, expected * keep.sum() / 20)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("logits_bias", [False, True])
@pytest.mark.parametrize("num_items_in_batch", [None, 20])
def test_fused_training_loss_matches_cross_entropy_on_full_logits(smoothing, logits_bias, num_items_in_batch):
    """In training the output projection and the loss run fused (no logits returned); the loss and the gradients of
    every parameter (the tied embedding, and a trainable `final_logits_bias`) are those of torch's
    `cross_entropy(label_smoothing=ε)` on the full logits of the unfused model."""
    src, mask = padded_batch()
    labels = torch.randint(4, 37, (3, 5))
    labels[1, 3:] = -100
    labels[2, 2:] = -100
    results = []
    for fused in (True, False):
        model = make_model(seed=6, add_final_logits_bias=logits_bias, fused_output_loss=fused).train()
        if logits_bias:
            model.final_logits_bias = nn.Parameter(torch.randn(1, 37, generator=torch.Generator().manual_seed(0)))
        out = model(input_ids=src, attention_mask=mask, labels=labels, label_smoothing=smoothing,
                    num_items_in_batch=num_items_in_batch)  # fmt: skip
        if fused:
            assert out.logits is None
            loss = out.loss
        else:
            loss = nn.functional.cross_entropy(
                out.logits.flatten(0, 1), labels.flatten(), reduction="sum", label_smoothing=smoothing
            ) / (num_items_in_batch or (labels != -100).sum())
            torch.testing.assert_close(out.loss, loss, rtol=1e-6, atol=1e-7)
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (fused_loss, fused_grads), (ref_loss, ref_grads) = results
    torch.testing.assert_close(fused_loss, ref_loss, rtol=1e-6, atol=1e-7)
    assert fused_grads.keys() == ref_grads.keys() and ("final_logits_bias" in ref_grads) == logits_bias
    assert "model.shared.weight" in ref_grads and "lm_head.weight" not in ref_grads  # tied: one parameter
    for name, grad in ref_grads.items():
        torch.testing.assert_close(fused_grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_logits_are_returned_wherever_the_loss_is_not_fused():
    """Evaluation, the flag off, a forward hook on `lm_head` (as FSDP and PEFT add) and CPU autocast all call
    `lm_head` and return logits, with the same loss."""
    src, mask = padded_batch()
    labels = torch.randint(4, 37, (3, 5))
    model = make_model(seed=2).train()
    fused = model(input_ids=src, attention_mask=mask, labels=labels, label_smoothing=0.1)
    assert fused.logits is None
    calls = []
    handle = model.lm_head.register_forward_hook(lambda *args: calls.append(1))
    hooked = model(input_ids=src, attention_mask=mask, labels=labels, label_smoothing=0.1)
    handle.remove()
    assert calls == [1] and hooked.logits.shape == (3, 5, 37)
    torch.testing.assert_close(hooked.loss, fused.loss)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(input_ids=src, attention_mask=mask, labels=labels).logits is not None
    model.config.fused_output_loss = False
    assert model(input_ids=src, attention_mask=mask, labels=labels).logits is not None
    model.config.fused_output_loss = True
    model.eval()
    evaluated = model(input_ids=src, attention_mask=mask, labels=labels, label_smoothing=0.1)
    assert evaluated.logits.shape == (3, 5, 37)
    torch.testing.assert_close(evaluated.loss, fused.loss)


def test_decoder_inputs_are_built_from_labels():
    model = make_model()
    labels = torch.tensor([[5, 6, 7, 2], [8, 2, -100, -100]])
    expected = torch.tensor([[1, 5, 6, 7], [1, 8, 2, 0]])
    assert torch.equal(shift_tokens_right(labels, 0, 1), expected)
    assert torch.equal(model.prepare_decoder_input_ids_from_labels(labels), expected)
    src, mask = padded_batch(batch=2)
    torch.testing.assert_close(
        model(input_ids=src, attention_mask=mask, labels=labels).logits,
        model(input_ids=src, attention_mask=mask, decoder_input_ids=expected).logits,
    )


def test_gradients_reach_every_parameter():
    model = make_model(normalize_before=False).train()
    src, mask = padded_batch()
    model(input_ids=src, attention_mask=mask, labels=torch.randint(4, 37, (3, 5))).loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_activation_checkpointing_gives_the_same_gradients():
    src, mask = padded_batch()
    labels = torch.randint(4, 37, (3, 5))
    grads = []
    for checkpointing in (False, True):
        model = make_model(seed=5).train()
        if checkpointing:
            model.activation_checkpointing_enable()
            assert model.is_activation_checkpointing
        loss = model(input_ids=src, attention_mask=mask, labels=labels).loss
        loss.backward()
        grads.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    for name in grads[0][1]:
        torch.testing.assert_close(grads[0][1][name], grads[1][1][name], msg=name)


def test_attentions_and_hidden_states_are_returned_under_eager():
    model = make_model()
    model.set_attn_implementation("eager")
    src, mask = padded_batch()
    out = model(
        input_ids=src, attention_mask=mask, decoder_input_ids=torch.ones(3, 4, dtype=torch.long),
        output_attentions=True, output_hidden_states=True,
    )  # fmt: skip
    assert len(out.encoder_attentions) == 2 and len(out.decoder_attentions) == 3 and len(out.cross_attentions) == 3
    assert out.cross_attentions[0].shape == (3, 2, 4, 9)  # (batch, decoder heads, tgt_len, src_len)
    assert torch.all(out.cross_attentions[0][2, :, :, 5:] == 0)  # padded source positions get no weight
    assert len(out.encoder_hidden_states) == 3 and len(out.decoder_hidden_states) == 4


def test_return_dict_false_gives_a_tuple():
    model = make_model()
    src, mask = padded_batch()
    out = model(input_ids=src, attention_mask=mask, labels=torch.randint(4, 37, (3, 5)), return_dict=False)
    assert isinstance(out, tuple) and out[0].dim() == 0 and out[1].shape == (3, 5, 37)


def test_no_split_modules_name_real_layer_classes():
    model = make_model()
    classes = {type(m).__name__ for m in model.modules()}
    assert set(model._no_split_modules) <= classes


def test_long_inputs_beyond_max_position_embeddings():
    model = make_model()  # max_position_embeddings = 12
    ids = torch.randint(4, 37, (1, 40))
    assert torch.isfinite(model(input_ids=ids, decoder_input_ids=ids).logits).all()


class TestBadInput:
    def test_token_ids_outside_vocabulary(self):
        with pytest.raises(ValueError, match=r"`input_ids` holds ids outside the vocabulary \[0, 37\)"):
            make_model()(input_ids=torch.tensor([[5, 37]]), decoder_input_ids=torch.tensor([[1]]))
        with pytest.raises(ValueError, match="`decoder_input_ids` holds ids outside"):
            make_model()(input_ids=torch.tensor([[5, 6]]), decoder_input_ids=torch.tensor([[-1]]))
        with pytest.raises(ValueError, match="`labels` holds ids outside"):
            make_model()(input_ids=torch.tensor([[5, 6]]), labels=torch.tensor([[99, -100]]))

    def test_float_ids(self):
        with pytest.raises(ValueError, match="integer token ids"):
            make_model()(input_ids=torch.tensor([[5.0, 6.0]]), decoder_input_ids=torch.tensor([[1]]))

    def test_mask_shape_differs_from_ids(self):
        with pytest.raises(ValueError, match=r"`attention_mask` has shape \(2, 4\)"):
            make_model()(
                input_ids=torch.ones(2, 5, dtype=torch.long),
                attention_mask=torch.ones(2, 4, dtype=torch.long),
                decoder_input_ids=torch.ones(2, 1, dtype=torch.long),
            )
        with pytest.raises(ValueError, match="`decoder_attention_mask` has shape"):
            make_model()(
                input_ids=torch.ones(2, 5, dtype=torch.long),
                decoder_input_ids=torch.ones(2, 3, dtype=torch.long),
                decoder_attention_mask=torch.ones(2, 7, dtype=torch.long),
            )

    def test_neither_labels_nor_decoder_inputs(self):
        with pytest.raises(ValueError, match="pass `decoder_input_ids`.*or `labels`"):
            make_model()(input_ids=torch.ones(2, 5, dtype=torch.long))


@pytest.mark.parametrize(
    "module",
    [VanillaTransformerForConditionalGeneration, VanillaTransformerModel, VanillaTransformerEncoder,
     VanillaTransformerDecoder, EncoderLayer, DecoderLayer],
)  # fmt: skip
def test_forward_kwargs_are_typed_for_transformers_tooling(module):
    """`**kwargs: Unpack[TransformersKwargs]`, as in transformers' own models, so that its tooling (e.g. the common
    eager-vs-sdpa test's `output_attentions` variant) sees which keyword arguments the forward passes accept."""
    kwargs = inspect.signature(module.forward).parameters["kwargs"]
    assert typing.get_args(kwargs.annotation) == (TransformersKwargs,)
    accepted = set(TransformersKwargs.__annotations__)
    assert {"output_attentions", "output_hidden_states", "num_items_in_batch"} <= accepted


def test_sdpa_is_the_default_and_matches_eager():
    model = make_model(seed=14)
    assert model.config._attn_implementation == "sdpa"
    src, mask = padded_batch()
    tgt = torch.randint(4, 37, (3, 5))
    with torch.no_grad():
        sdpa = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        model.set_attn_implementation("eager")
        eager = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
    torch.testing.assert_close(sdpa, eager, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_flex_attention_matches_eager():
    """flex_attention compiles its kernel (about a minute on 2 CPU cores)."""
    model = make_model(seed=14)
    src, mask = padded_batch()
    tgt = torch.randint(4, 37, (3, 5))
    with torch.no_grad():
        model.set_attn_implementation("eager")
        eager = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
        model.set_attn_implementation("flex_attention")
        flex = model(input_ids=src, attention_mask=mask, decoder_input_ids=tgt).logits
    torch.testing.assert_close(flex, eager, atol=1e-4, rtol=1e-4)


def test_initialisation():
    model = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig.from_preset("tiny", vocab_size=3000))
    shared = model.model.shared.weight
    torch.testing.assert_close(shared.std().item(), 0.02, atol=0.001, rtol=0)  # N(0, init_std²), init_std = 0.02
    assert torch.all(shared[model.config.pad_token_id] == 0)
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name != "lm_head":
            torch.testing.assert_close(module.weight.std().item(), 0.02, atol=0.002, rtol=0, msg=name)
            assert module.weight.mean().abs() < 0.002 and torch.all(module.bias == 0), name
        if isinstance(module, torch.nn.LayerNorm):
            assert torch.all(module.weight == 1) and torch.all(module.bias == 0), name
    assert model.lm_head.weight.data_ptr() == shared.data_ptr()


def test_fairseq_initialisation_when_init_std_is_none():
    config = VanillaTransformerConfig.from_preset("tiny", vocab_size=3000, init_std=None)
    model = VanillaTransformerForConditionalGeneration(config)
    shared = model.model.shared.weight
    torch.testing.assert_close(shared.std().item(), 64**-0.5, atol=0.01, rtol=0)  # N(0, d_model^-1)
    assert torch.all(shared[model.config.pad_token_id] == 0)
    fc1 = model.model.encoder.layers[0].fc1
    bound = math.sqrt(6 / (64 + 256))  # Xavier-uniform
    assert fc1.weight.abs().max() <= bound and fc1.weight.abs().max() > 0.9 * bound
    assert torch.all(fc1.bias == 0)


def test_bfloat16_forward_and_generate(tmp_path):
    make_model(seed=15).save_pretrained(tmp_path)
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    src, mask = padded_batch()
    out = model(input_ids=src, attention_mask=mask, labels=torch.randint(4, 37, (3, 4)))
    assert out.logits.dtype == torch.bfloat16 and torch.isfinite(out.loss)
    assert model.generate(src, attention_mask=mask, max_new_tokens=3).shape[0] == 3


def test_device_map_auto_with_disk_offload_keeps_layers_whole(tmp_path):
    model = make_model(seed=16)
    model.save_pretrained(tmp_path / "model")
    src, mask = padded_batch()
    expected = model.generate(src, attention_mask=mask, num_beams=2, max_new_tokens=4, min_new_tokens=4)
    offloaded = AutoModelForSeq2SeqLM.from_pretrained(
        tmp_path / "model", device_map="auto", max_memory={"cpu": "30KB"}, offload_folder=tmp_path / "offload"
    )
    assert "disk" in set(offloaded.hf_device_map.values())
    for name in offloaded.hf_device_map:  # no layer split across devices
        assert not re.search(r"layers\.\d+\.", name), name
    got = offloaded.generate(src, attention_mask=mask, num_beams=2, max_new_tokens=4, min_new_tokens=4)
    assert torch.equal(got, expected)
