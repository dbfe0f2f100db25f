import pytest
from transformers import AutoConfig, GenerationConfig

from vanilla_transformer import PRESETS, VanillaTransformerConfig


def test_defaults_are_the_base_model():
    config = VanillaTransformerConfig()
    base = VanillaTransformerConfig.from_preset("base")
    for field in PRESETS["base"]:
        assert getattr(config, field) == getattr(base, field)
    assert config.activation_function == "relu"
    assert config.scale_embedding and config.tie_word_embeddings and not config.normalize_before
    assert config.attention_dropout == 0.0 and config.activation_dropout == 0.0  # not in the paper


@pytest.mark.parametrize(
    "name, d_model, d_ff, heads, p_drop",
    [("base", 512, 2048, 8, 0.1), ("big", 1024, 4096, 16, 0.3)],  # paper Table 3
)
def test_presets_equal_table_3(name, d_model, d_ff, heads, p_drop):
    config = VanillaTransformerConfig.from_preset(name)
    assert (config.encoder_layers, config.decoder_layers) == (6, 6)
    assert config.d_model == d_model
    assert config.encoder_ffn_dim == config.decoder_ffn_dim == d_ff
    assert config.encoder_attention_heads == config.decoder_attention_heads == heads
    assert config.d_model // heads == 64  # d_k = d_v = 64
    assert config.dropout == p_drop


def test_preset_overrides_and_attribute_map():
    config = VanillaTransformerConfig.from_preset("big", vocab_size=32000, dropout=0.1)
    assert (config.vocab_size, config.dropout, config.d_model) == (32000, 0.1, 1024)
    assert config.hidden_size == 1024
    assert config.num_attention_heads == 16
    assert config.num_hidden_layers == 6


def test_unknown_preset_lists_the_allowed_ones():
    with pytest.raises(ValueError, match="allowed presets: base, big, small, tiny"):
        VanillaTransformerConfig.from_preset("huge")


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(d_model=500), "encoder_attention_heads"),
        (dict(decoder_attention_heads=7), "decoder_attention_heads"),
        (dict(d_model=0), "d_model"),
        (dict(encoder_layers=-1), "encoder_layers"),
        (dict(decoder_ffn_dim=0), "decoder_ffn_dim"),
        (dict(vocab_size=0), "vocab_size"),
        (dict(dropout=1.0), "dropout"),
        (dict(attention_dropout=-0.1), "attention_dropout"),
        (dict(activation_function="tanh"), "activation_function"),
        (dict(pad_token_id=40000), "pad_token_id"),
    ],
)
def test_invalid_values_name_the_field(overrides, field):
    with pytest.raises(ValueError, match=f"`{field}`"):
        VanillaTransformerConfig(**overrides)


def test_round_trip_through_auto_config(tmp_path):
    config = VanillaTransformerConfig.from_preset("tiny", vocab_size=101, normalize_before=True)
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, VanillaTransformerConfig)
    expected = {k: v for k, v in config.to_dict().items() if k != "_name_or_path"}
    assert {k: v for k, v in loaded.to_dict().items() if k != "_name_or_path"} == expected


def test_generation_defaults_come_from_token_ids():
    generation_config = GenerationConfig.from_model_config(VanillaTransformerConfig())
    assert generation_config.decoder_start_token_id == 1
    assert generation_config.eos_token_id == 2
    assert generation_config.pad_token_id == 0


def test_from_preset_rejects_unknown_names_but_keeps_transformers_generic_kwargs(tmp_path):
    with pytest.raises(ValueError, match=r"'dropuot' \(did you mean 'dropout'\?\)"):
        VanillaTransformerConfig.from_preset("tiny", dropuot=0.3)
    generic = dict(
        attn_implementation="eager", dtype="float32", torch_dtype="float32", output_attentions=True,
        output_hidden_states=True, return_dict=False, num_labels=3, sep_token_id=3, num_beams=4, max_length=30,
        hidden_size=64, architectures=["VanillaTransformerForConditionalGeneration"],
    )  # fmt: skip
    config = VanillaTransformerConfig.from_preset("tiny", **generic)
    assert config._attn_implementation == "eager" and config.d_model == 64
    config.save_pretrained(tmp_path)  # a saved config.json (transformers' own keys included) still loads
    assert VanillaTransformerConfig.from_pretrained(tmp_path).to_dict() == config.to_dict()
