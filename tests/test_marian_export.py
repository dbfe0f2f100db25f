"""Native MarianMT export: MarianMTModel's logits and generate() tokens equal ours, the import gives back our weights,
the folder loads without this package, CTranslate2's converter reads it, and bad inputs are one-line errors."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, MarianMTModel

from tests.conftest import make_model
from tests.onnx_helpers import SENTENCES, build_tokenizer, load_trained_model, trained_model_dir
from vanilla_transformer.marian.cli import export_marian_main
from vanilla_transformer.marian.exporter import (
    FAST_TOKENIZER_CLASS,
    MIN_POSITIONS,
    marian_config_from,
    save_marian,
    to_marian,
    verify_export,
)
from vanilla_transformer.marian.importer import from_marian, interleave_permutation

ROOT = Path(__file__).resolve().parents[1]
# Sources longer than the models' max_position_embeddings (12): Marian's table (1024 rows) covers them.
SOURCES = SENTENCES + ["a b c d e f g h i j k l m n o p q", "0 1 2 3 4 5 6 0 1 2 3 4 5 6"]
# (name, config overrides) of the random tiny models (conftest's unequal sizes): every embedding layout MarianMT has,
# the activations it shares with us, unscaled embeddings and a non-zero logits bias.
VARIANTS = [
    ("shared", {}),
    ("untied", {"tie_word_embeddings": False}),
    ("separate", {"share_encoder_decoder_embeddings": False, "decoder_vocab_size": 41}),
    ("separate-untied", {"share_encoder_decoder_embeddings": False, "decoder_vocab_size": 41,
                         "tie_word_embeddings": False}),
    ("gelu-unscaled", {"activation_function": "gelu", "scale_embedding": False}),
    ("swish-bias", {"activation_function": "swish", "add_final_logits_bias": True}),
]  # fmt: skip


def random_model(overrides: dict, seed: int = 0):
    """A random tiny model with weights large enough that the comparisons are not of near-zero logits."""
    model = make_model(seed=seed, **overrides)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "layer_norm" in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)  # γ ≠ 1, β ≠ 0: the permutation must carry them
            else:
                parameter.normal_(0.0, 0.3 if parameter.dim() == 2 else 0.1)
        if model.final_logits_bias is not None:
            model.final_logits_bias.normal_(0.0, 1.0)
    return model


def padded_batch(generator: torch.Generator, lengths: list[int], vocab: int, start: int | None = None):
    """Random ids, rows padded (0) after `lengths[i]`; with `start`, the first column is that token."""
    ids = torch.randint(3, vocab, (len(lengths), max(lengths)), generator=generator)  # (batch, len)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    ids[mask == 0] = 0
    if start is not None:
        ids[:, 0] = start
    return ids, mask


def model_folder(tmp_path: Path, model, name: str = "model") -> Path:
    folder = tmp_path / name
    model.save_pretrained(folder)
    build_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def trained_export(tmp_path_factory) -> Path:
    """The Marian export of the tiny trained copy model (shared with the ONNX tests), written by the CLI."""
    output = tmp_path_factory.mktemp("marian") / "export"
    assert export_marian_main(["--model", str(trained_model_dir()), "--output", str(output)]) == 0
    return output


# --------------------------------------------------------------------------------------------------------------------
# The configuration: what MarianMT expresses, what it cannot
# --------------------------------------------------------------------------------------------------------------------


def test_config_carries_every_field_that_computes():
    config = make_model(activation_function="swish", share_encoder_decoder_embeddings=False, decoder_vocab_size=41,
                        tie_word_embeddings=False, scale_embedding=False).config  # fmt: skip
    marian = marian_config_from(config)
    assert marian.model_type == "marian" and marian.architectures == ["MarianMTModel"]
    for field in ("vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
                  "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "activation_function",
                  "scale_embedding", "share_encoder_decoder_embeddings", "tie_word_embeddings", "pad_token_id",
                  "eos_token_id", "bos_token_id", "decoder_start_token_id"):  # fmt: skip
        assert getattr(marian, field) == getattr(config, field), field
    assert marian.decoder_vocab_size == 41
    assert marian.max_position_embeddings == MIN_POSITIONS  # max(1024, 12)
    assert marian_config_from(make_model(max_position_embeddings=2000).config).max_position_embeddings == 2000
    assert marian_config_from(config, max_positions=64).max_position_embeddings == 64
    assert marian.forced_eos_token_id is None  # not MarianConfig's default 0 (OPUS-MT's </s>)


@pytest.mark.parametrize(
    "overrides, field",
    [({"normalize_before": True}, "normalize_before=True"), ({"layer_norm_eps": 1e-6}, "layer_norm_eps=1e-06")],
)
def test_config_refuses_what_marian_cannot_compute(overrides, field):
    with pytest.raises(ValueError, match=field):
        marian_config_from(make_model(**overrides).config)


def test_config_refuses_unknown_activation_and_short_tables():
    config = make_model().config
    config.activation_function = "not_an_activation"  # past our own check: MarianMT's ACT2FN is the judge here
    with pytest.raises(ValueError, match="activation_function='not_an_activation'"):
        marian_config_from(config)
    with pytest.raises(ValueError, match="max_positions=8 is below"):
        marian_config_from(make_model().config, max_positions=8)


# --------------------------------------------------------------------------------------------------------------------
# Exactness: logits, generation, round trip
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides", [v[1] for v in VARIANTS], ids=[v[0] for v in VARIANTS])
def test_saved_folder_logits_equal_ours(tmp_path, overrides):
    """MarianMTModel.from_pretrained(OUT) against ours, fp32, padded batches; positions run past
    max_position_embeddings (12) on both sides."""
    model = random_model(overrides)
    output = save_marian(model, tmp_path / "marian", tokenizer_dir=model_folder(tmp_path, make_model()))
    marian = MarianMTModel.from_pretrained(output).eval()
    assert type(AutoModelForSeq2SeqLM.from_pretrained(output)) is MarianMTModel
    generator = torch.Generator().manual_seed(0)
    config = model.config
    for source_lengths, target_lengths in (([5, 3], [4, 2]), ([17, 30, 9], [20, 25, 1]), ([40], [33])):
        source, source_mask = padded_batch(generator, source_lengths, config.vocab_size)
        target, target_mask = padded_batch(generator, target_lengths, config.target_vocab_size,
                                           config.decoder_start_token_id)  # fmt: skip
        inputs = dict(input_ids=source, attention_mask=source_mask, decoder_input_ids=target,
                      decoder_attention_mask=target_mask)  # fmt: skip
        with torch.no_grad():
            expected = model(**inputs).logits  # (batch, tgt_len, target vocab)
            actual = marian(**inputs).logits
        valid = target_mask.bool()
        torch.testing.assert_close(actual[valid], expected[valid], atol=1e-4, rtol=0)
        assert expected[valid].abs().max() > 1.0  # logits that mean something


def test_in_memory_model_and_weights_layout():
    """`to_marian` permutes every d_model axis back to Marian's [sin | cos] halves: embeddings, projections, γ/β."""
    model = random_model({"add_final_logits_bias": True})
    marian = to_marian(model)
    inverse = torch.argsort(interleave_permutation(model.config.d_model))
    ours, theirs = model.state_dict(), marian.state_dict()
    torch.testing.assert_close(theirs["model.shared.weight"], ours["model.shared.weight"][:, inverse], atol=0, rtol=0)
    name = "model.decoder.layers.1.fc2.weight"
    torch.testing.assert_close(theirs[name], ours[name][inverse, :], atol=0, rtol=0)
    name = "model.encoder.layers.0.self_attn.q_proj.bias"  # not in d_model's residual layout: copied
    torch.testing.assert_close(theirs[name], ours[name], atol=0, rtol=0)
    torch.testing.assert_close(theirs["final_logits_bias"], ours["final_logits_bias"], atol=0, rtol=0)
    assert torch.equal(to_marian(make_model()).final_logits_bias, torch.zeros(1, 37))  # ours has none: zeros


def test_round_trip_gives_back_our_weights(tmp_path):
    for name, overrides in VARIANTS:
        model = random_model(overrides)
        output = save_marian(model, tmp_path / name, tokenizer_dir=model_folder(tmp_path, make_model(), "tok"))
        back = from_marian(output)
        ours, imported = model.state_dict(), back.state_dict()
        assert set(imported) == set(ours) | {"final_logits_bias"}, name
        for key, tensor in ours.items():
            assert torch.equal(imported[key], tensor), (name, key)
        expected_bias = ours.get("final_logits_bias", torch.zeros(1, model.config.target_vocab_size))
        assert torch.equal(imported["final_logits_bias"], expected_bias), name


@pytest.mark.parametrize("num_beams", [1, 4])
def test_generate_tokens_equal_ours(trained_export, num_beams):
    """A trained model (peaked distributions: ties do not decide), sources and outputs past 12 positions."""
    model = load_trained_model()
    marian = MarianMTModel.from_pretrained(trained_export).eval()
    tokenizer = AutoTokenizer.from_pretrained(trained_export)
    batch = tokenizer(SOURCES, return_tensors="pt", padding=True)
    # min_new_tokens keeps every row decoding past max_position_embeddings (12)
    settings = dict(num_beams=num_beams, min_new_tokens=16, max_new_tokens=24)
    if num_beams > 1:
        settings["early_stopping"] = True
    expected = model.generate(**batch, **settings)
    actual = marian.generate(**batch, **settings)
    assert torch.equal(actual, expected)
    assert expected.shape[1] > 16


def test_generation_config_works_out_of_the_box(trained_export):
    generation = json.loads((trained_export / "generation_config.json").read_text())
    model = load_trained_model()
    assert generation["decoder_start_token_id"] == model.config.decoder_start_token_id == 1
    assert (generation["eos_token_id"], generation["pad_token_id"], generation["bos_token_id"]) == (2, 0, 1)
    assert generation["num_beams"] == 4 and generation["max_length"] == 512
    assert "forced_eos_token_id" not in generation and not generation.get("_from_model_config")
    marian = MarianMTModel.from_pretrained(trained_export).eval()
    tokenizer = AutoTokenizer.from_pretrained(trained_export)
    batch = tokenizer(SOURCES[:2], return_tensors="pt", padding=True)
    defaults = dict(num_beams=4, max_length=512)  # the written defaults, given to ours explicitly
    assert torch.equal(marian.generate(**batch), model.generate(**batch, **defaults))


def test_tokenizer_is_the_fast_one_with_its_special_tokens(trained_export):
    settings = json.loads((trained_export / "tokenizer_config.json").read_text())
    assert settings["tokenizer_class"] == FAST_TOKENIZER_CLASS == "PreTrainedTokenizerFast"
    assert settings["model_max_length"] == MIN_POSITIONS
    exported, ours = AutoTokenizer.from_pretrained(trained_export), build_tokenizer()
    assert type(exported).__name__ == "TokenizersBackend"  # the fast tokenizer, not sentencepiece's MarianTokenizer
    assert exported(SOURCES).input_ids == ours(SOURCES).input_ids
    for role, token_id in (("pad", 0), ("bos", 1), ("eos", 2), ("unk", 3)):
        assert getattr(exported, f"{role}_token_id") == token_id, role


def test_tokenizer_special_tokens_are_checked_against_the_model(tmp_path):
    folder = model_folder(tmp_path, make_model())
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    del settings["bos_token"]  # named by the model only: taken from the vocabulary
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    output = save_marian(folder, tmp_path / "out")
    assert json.loads((output / "tokenizer_config.json").read_text())["bos_token"] == "<s>"
    assert AutoTokenizer.from_pretrained(output).bos_token_id == 1
    (folder / "tokenizer_config.json").write_text(json.dumps({**settings, "pad_token": "</s>"}))
    with pytest.raises(ValueError, match="pad_token '</s>' has id 2 but the model's pad_token_id is 0"):
        save_marian(folder, tmp_path / "out2")
    assert not (tmp_path / "out2").exists()


def test_verify_export_measures_the_saved_folder(trained_export):
    assert verify_export(trained_model_dir(), trained_export) < 1e-4


def test_model_imported_from_marian_goes_back_with_its_sentencepiece_tokenizer(tmp_path):
    """MarianMT → `save_converted` → `save_marian`: Marian's tokenizer files come back unchanged (MarianTokenizer),
    and so do the logits and the generation settings."""
    from tests.test_convert import build_marian
    from tests.test_convert import build_tokenizer as build_marian_tokenizer
    from vanilla_transformer.marian.importer import save_converted

    tokenizer = build_marian_tokenizer(tmp_path / "spm", separate=False)
    original = build_marian(tokenizer, share=True)
    original.save_pretrained(tmp_path / "marian")
    tokenizer.save_pretrained(tmp_path / "marian")
    save_converted(tmp_path / "marian", tmp_path / "ours")
    output = save_marian(tmp_path / "ours", tmp_path / "back")
    for name in ("source.spm", "target.spm", "vocab.json"):
        assert (output / name).read_bytes() == (tmp_path / "marian" / name).read_bytes(), name
    assert type(AutoTokenizer.from_pretrained(output)).__name__ == "MarianTokenizer"
    back = MarianMTModel.from_pretrained(output).eval()
    generation = back.generation_config
    pad = tokenizer.pad_token_id
    assert (generation.bad_words_ids, generation.num_beams, generation.max_length) == ([[pad]], 4, 24)
    assert generation.forced_eos_token_id == original.generation_config.forced_eos_token_id == 0
    batch = tokenizer(["a small test", "another one, longer than the first"], return_tensors="pt", padding=True)
    with torch.no_grad():
        expected = original(**batch, decoder_input_ids=batch.input_ids).logits  # (batch, len, vocab)
        actual = back(**batch, decoder_input_ids=batch.input_ids).logits
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=0)
    assert torch.equal(back.generate(**batch), original.generate(**batch))


# --------------------------------------------------------------------------------------------------------------------
# Loading where this package is not installed
# --------------------------------------------------------------------------------------------------------------------

ISOLATED_CHECK = textwrap.dedent(
    """
    import json, sys
    for name in ("vanilla_transformer", "vanilla_transformer_ort"):
        sys.modules[name] = None  # as on a machine without this package: importing it fails
    try:
        import vanilla_transformer  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("vanilla_transformer is importable")
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, MarianMTModel, pipeline

    folder, sources = sys.argv[1], json.loads(sys.argv[2])
    model = MarianMTModel.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    batch = tokenizer(sources, return_tensors="pt", padding=True)
    texts = tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True)
    # transformers 5 has no built-in translation task: the folder's own pipeline file (transformers-only code) is
    # the remote code trusted here; the model itself is transformers' MarianMTModel.
    translator = pipeline("translation", model=folder, trust_remote_code=True)
    piped = [result["translation_text"] for result in translator(sources)]
    print(json.dumps({
        "model": type(model).__name__,
        "auto_model": type(AutoModelForSeq2SeqLM.from_pretrained(folder)).__name__,
        "pipeline_model": type(translator.model).__name__,
        "tokenizer": type(tokenizer).__name__,
        "texts": texts,
        "piped": piped,
        "loaded": sorted(name for name in sys.modules if name.startswith("vanilla_transformer") and sys.modules[name]),
    }))
    """
)


def test_folder_loads_and_translates_without_the_package(trained_export, tmp_path):
    model = load_trained_model()
    tokenizer = build_tokenizer()
    batch = tokenizer(SOURCES, return_tensors="pt", padding=True)
    expected = tokenizer.batch_decode(model.generate(**batch, num_beams=4, max_length=512), skip_special_tokens=True)
    (tmp_path / "check.py").write_text(ISOLATED_CHECK)
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    result = subprocess.run(
        [sys.executable, "-I", str(tmp_path / "check.py"), str(trained_export), json.dumps(SOURCES)],
        cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["model"] == report["auto_model"] == report["pipeline_model"] == "MarianMTModel"
    assert report["tokenizer"] == "TokenizersBackend"
    assert report["texts"] == expected and report["piped"] == expected
    assert report["loaded"] == []
    assert any(len(text.split()) > 1 for text in expected)


# --------------------------------------------------------------------------------------------------------------------
# CTranslate2's own converter (ct2-transformers-converter) on the exported folder
# --------------------------------------------------------------------------------------------------------------------


def exact_marian_loader():
    """CTranslate2's `MarianMTLoader` without its three OPUS-MT assumptions, each replaced by what the folder states;
    the rest (weights, the [sin | cos] position table, √d_model, the spec and its checks) is CTranslate2's own.

    1. It drops the last vocabulary row: the <pad> that transformers' OPUS-MT conversion appends. This vocabulary has
       no such row (<pad> is 0), and `get_vocabulary` keeps the last token unless it is "<pad>": the converter stops
       with "Source vocabulary 0 has size 37 but the model expected a vocabulary of size 36".
    2. It starts the decoder from a zero embedding (`start_from_zero_embedding`), OPUS-MT's pad row, whatever
       `decoder_start_token_id` says; this model starts from <s>, whose embedding is trained.
    3. It builds the spec with `TransformerSpec.from_config(..., encoder_attention_heads)`, one head count for both
       stacks; the tiny model has 4 encoder and 2 decoder heads (a silent error: the shapes agree).
    """
    from ctranslate2.converters import transformers as ct2_transformers
    from ctranslate2.specs import transformer_spec

    class ExactMarianLoader(ct2_transformers.BartLoader):
        @property
        def architecture_name(self):
            return "MarianMTModel"

        def get_model_spec(self, model):
            config = model.config
            activation = ct2_transformers._SUPPORTED_ACTIVATIONS[config.activation_function]
            encoder = transformer_spec.TransformerEncoderSpec(
                config.encoder_layers, config.encoder_attention_heads, pre_norm=False, activation=activation
            )
            decoder = transformer_spec.TransformerDecoderSpec(
                config.decoder_layers, config.decoder_attention_heads, pre_norm=False, activation=activation
            )
            spec = transformer_spec.TransformerSpec(encoder, decoder)
            self.set_encoder(spec.encoder, model.model.encoder)
            self.set_decoder(spec.decoder, model.model.decoder)  # BartLoader's: starts from the start token
            self.set_linear(spec.decoder.projection, model.lm_head)
            spec.decoder.projection.bias = model.final_logits_bias.squeeze(0)  # (vocab,)
            return spec

    return ExactMarianLoader()


def test_ctranslate2_stock_marian_loader_refuses_this_vocabulary(trained_export, tmp_path):
    """The stock converter fails loudly on OPUS-MT's first assumption (see `exact_marian_loader`)."""
    from ctranslate2.converters import TransformersConverter

    with pytest.raises(ValueError, match="vocabulary of size 36"):
        TransformersConverter(str(trained_export)).convert(str(tmp_path / "ct2"))
    assert not (tmp_path / "ct2" / "model.bin").exists()


def test_ctranslate2_stock_converter_on_an_opus_mt_shaped_model(tmp_path):
    """A model imported from an OPUS-MT-shaped Marian (<pad> last, the decoder's zero start, equal head counts) and
    exported back follows the stock loader's conventions: CTranslate2's own converter then decodes as MarianMTModel."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from ctranslate2.converters import TransformersConverter
    from transformers import MarianConfig

    from tests.test_convert import TINY_MARIAN
    from tests.test_convert import build_tokenizer as build_marian_tokenizer
    from vanilla_transformer.export.ctranslate2_export import generation_options
    from vanilla_transformer.marian.exporter import ctranslate2_converter_issues
    from vanilla_transformer.marian.importer import save_converted

    tokenizer = build_marian_tokenizer(tmp_path / "spm", separate=False)
    pad = tokenizer.pad_token_id
    assert pad == len(tokenizer.encoder) - 1
    torch.manual_seed(0)
    config = MarianConfig(**{**TINY_MARIAN, "decoder_attention_heads": 4}, vocab_size=pad + 1, pad_token_id=pad,
                          decoder_start_token_id=pad)  # fmt: skip
    original = MarianMTModel(config).eval()
    with torch.no_grad():  # weights large enough that outputs differ per sentence; the pad row zero, as in OPUS-MT
        for name, parameter in original.named_parameters():
            if "layer_norm" not in name and "embed_positions" not in name:
                parameter.normal_(0.0, 0.3 if parameter.dim() == 2 else 0.1)
        original.model.shared.weight[pad] = 0.0
        original.final_logits_bias.normal_(0.0, 0.5)
    original.save_pretrained(tmp_path / "marian")
    tokenizer.save_pretrained(tmp_path / "marian")
    save_converted(tmp_path / "marian", tmp_path / "ours")
    output = save_marian(tmp_path / "ours", tmp_path / "back")
    assert ctranslate2_converter_issues(output) == []

    folder = TransformersConverter(str(output)).convert(str(tmp_path / "ct2"))  # CTranslate2's own loader
    translator = ctranslate2.Translator(folder, device="cpu", intra_threads=1)
    texts = ["a small test", "another one, longer than the first", "the file could not be opened"]
    sources = [tokenizer.convert_ids_to_tokens(tokenizer(text).input_ids) for text in texts]
    results = translator.translate_batch(sources, **generation_options(num_beams=1, max_new_tokens=16))
    outputs = []
    for text, result in zip(texts, results, strict=True):
        ids = original.generate(**tokenizer(text, return_tensors="pt"), num_beams=1, max_new_tokens=16,
                                forced_eos_token_id=None, bad_words_ids=[[pad]])[0, 1:].tolist()  # fmt: skip
        ids = ids[: ids.index(0) + 1] if 0 in ids else ids  # </s> is 0 in OPUS-MT's vocabulary
        assert result.hypotheses[0] == tokenizer.convert_ids_to_tokens(ids), text
        outputs.append(tuple(ids))
    assert len(set(outputs)) == len(texts)


def test_ctranslate2_converter_issues_name_the_three_conventions(trained_export):
    from vanilla_transformer.marian.exporter import ctranslate2_converter_issues

    issues = ctranslate2_converter_issues(trained_export)
    assert len(issues) == 3
    assert "ends with '6'" in issues[0] and "token 1" in issues[1] and "4 and 2 attention heads" in issues[2]


@pytest.mark.parametrize("num_beams", [1, 4])
def test_ctranslate2_converter_translates_like_ours(trained_export, tmp_path, monkeypatch, num_beams):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from ctranslate2.converters import TransformersConverter
    from ctranslate2.converters import transformers as ct2_transformers

    from vanilla_transformer.export.ctranslate2_export import generation_options

    monkeypatch.setitem(ct2_transformers._MODEL_LOADERS, "MarianConfig", exact_marian_loader())
    folder = TransformersConverter(str(trained_export)).convert(str(tmp_path / "ct2"))
    settings = json.loads((Path(folder) / "config.json").read_text())
    assert settings["decoder_start_token"] == "<s>" and settings["eos_token"] == "</s>"
    translator = ctranslate2.Translator(folder, device="cpu", intra_threads=1)

    model, tokenizer = load_trained_model(), build_tokenizer()
    sources = [tokenizer.convert_ids_to_tokens(tokenizer(text).input_ids) for text in SOURCES]
    # Greedy decodes past position 12 (min_new_tokens); beam search without it, which CTranslate2 and transformers
    # apply to beam scores differently (before and after the softmax).
    min_new_tokens = 14 if num_beams == 1 else 0
    options = generation_options(num_beams=num_beams, min_new_tokens=min_new_tokens, max_new_tokens=24)
    results = translator.translate_batch(sources, **options)
    for text, result in zip(SOURCES, results, strict=True):
        settings = dict(num_beams=num_beams, min_new_tokens=min_new_tokens, max_new_tokens=24)
        if num_beams > 1:
            settings["early_stopping"] = True
        ids = model.generate(**tokenizer(text, return_tensors="pt"), **settings)[0, 1:].tolist()  # without the start
        ids = ids[: ids.index(2) + 1] if 2 in ids else ids
        assert result.hypotheses[0] == tokenizer.convert_ids_to_tokens(ids), text


# --------------------------------------------------------------------------------------------------------------------
# The Hub: vt-push-to-hub --format marian (Hub calls faked as in tests/test_hub.py)
# --------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """The trained model as a training run leaves it: with metrics and a training record."""
    import shutil

    folder = tmp_path / "run"
    shutil.copytree(trained_model_dir(), folder)
    (folder / "all_results.json").write_text(json.dumps({"test_bleu": 12.3456, "test_chrf": 40.5}))
    (folder / "training_info.json").write_text(json.dumps({"source_lang": "en", "target_lang": "de", "steps": 120}))
    return folder


def test_hub_dry_run_writes_the_marian_folder_and_its_card(run_dir, tmp_path, capsys):
    from huggingface_hub import ModelCard

    from vanilla_transformer.hub.cli import push_to_hub_command

    onnx = tmp_path / "onnx-export"
    onnx.mkdir()
    (onnx / "encoder_model.onnx").write_bytes(b"stand-in")  # only its presence is checked
    out = tmp_path / "hub"
    argv = ["--model", str(run_dir), "--repo_id", "someone/en-de-marian", "--format", "marian", "--onnx_folder",
            str(onnx), "--dry_run", str(out)]  # fmt: skip
    assert push_to_hub_command(argv) == 0
    files = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert files == {"README.md", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                     "tokenizer_config.json", "pipeline_vanilla_transformer.py", "all_results.json",
                     "training_info.json", "onnx/encoder_model.onnx"}  # fmt: skip
    assert "Dry run" in capsys.readouterr().out
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "marian" and "auto_map" not in config
    assert verify_export(run_dir, out) < 1e-4  # the uploaded weights are the exact export

    card = ModelCard.load(out / "README.md")  # huggingface_hub's own parser
    assert "marian" in card.data.tags and card.data.pipeline_tag == "translation"
    assert card.data.eval_results[0].metric_value == 12.35
    text = card.text
    assert "{{" not in text and "no remote code" in text and "1024 positions" in text
    assert 'AutoModelForSeq2SeqLM.from_pretrained("someone/en-de-marian")' in text
    assert 'pipeline("translation", model="someone/en-de-marian", trust_remote_code=True)' in text
    assert "does not convert this folder exactly" in text and "4 and 2 attention heads" in text
    assert "vt-export-ctranslate2" in text and "The ONNX export is in `onnx/`." in text


def test_hub_upload_of_the_marian_folder(run_dir, monkeypatch, capsys):
    import huggingface_hub

    from tests.test_hub import SECRET, FakeHub
    from vanilla_transformer.hub.cli import push_to_hub_main

    fake = FakeHub()
    monkeypatch.setattr(huggingface_hub, "HfApi", lambda *a, **k: fake)
    monkeypatch.setenv("HF_TOKEN", SECRET)
    assert push_to_hub_main(["--model", str(run_dir), "--repo_id", "someone/en-de-marian", "--format", "marian"]) == 0
    assert [call[0] for call in fake.calls] == ["create_repo", "upload_folder"]
    assert "config.json" in fake.uploaded and "pipeline_vanilla_transformer.py" in fake.uploaded
    assert not any(name.startswith("modeling_") for name in fake.uploaded)  # no model code: transformers' own
    captured = capsys.readouterr()
    assert SECRET not in captured.out + captured.err
    assert "https://huggingface.co/someone/en-de-marian/commit/abc" in captured.out


def test_hub_refuses_an_unknown_format(run_dir, tmp_path):
    from vanilla_transformer.hub import prepare_hub_folder

    with pytest.raises(ValueError, match="hub format 'onnx'"):
        prepare_hub_folder(run_dir, tmp_path / "hub", "someone/x", ROOT / "model_card.md", hub_format="onnx")


# --------------------------------------------------------------------------------------------------------------------
# Bad inputs: one line, exit status 2, nothing written
# --------------------------------------------------------------------------------------------------------------------


def run_cli(capsys, *args: str) -> tuple[int, str]:
    capsys.readouterr()  # what building the inputs printed (progress bars)
    status = export_marian_main(list(args))
    return status, capsys.readouterr().err


def assert_one_line_error(status: int, error: str, *fragments: str) -> None:
    assert status == 2
    assert error.count("\n") == 1 and error.startswith("vt-export-marian: error: "), error
    for fragment in fragments:
        assert fragment in error, error


def leftovers(parent: Path) -> list[str]:
    return sorted(path.name for path in parent.iterdir() if path.name.startswith("."))


@pytest.mark.parametrize(
    "overrides, fragment", [({"normalize_before": True}, "normalize_before"), ({"layer_norm_eps": 1e-6}, "1e-06")]
)
def test_cli_refuses_models_marian_cannot_compute(tmp_path, capsys, overrides, fragment):
    folder = model_folder(tmp_path, make_model(**overrides))
    status, error = run_cli(capsys, "--model", str(folder), "--output", str(tmp_path / "out"))
    assert_one_line_error(status, error, fragment)
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_cli_refuses_a_model_folder_without_tokenizer(tmp_path, capsys):
    folder = tmp_path / "model"
    make_model().save_pretrained(folder)
    status, error = run_cli(capsys, "--model", str(folder), "--output", str(tmp_path / "out"))
    assert_one_line_error(status, error, "no tokenizer", "tokenizer.json")
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []
    build_tokenizer().save_pretrained(tmp_path / "tokenizer")  # --tokenizer names where it is
    assert export_marian_main(["--model", str(folder), "--output", str(tmp_path / "out"), "--tokenizer",
                               str(tmp_path / "tokenizer")]) == 0  # fmt: skip
    assert (tmp_path / "out" / "tokenizer.json").is_file()


def test_weight_progress_bars_show_only_with_debug(tmp_path, capsys):
    """transformers' "Loading weights" and "Writing model shards" bars stay off a plain run's stderr; --debug
    shows them."""
    folder = model_folder(tmp_path, make_model())
    capsys.readouterr()
    assert export_marian_main(["--model", str(folder), "--output", str(tmp_path / "plain")]) == 0
    plain = capsys.readouterr().err
    assert export_marian_main(["--model", str(folder), "--output", str(tmp_path / "debug"), "--debug"]) == 0
    debug = capsys.readouterr().err
    for bar in ("Loading weights", "Writing model shards"):
        assert bar not in plain and bar in debug, (bar, plain)


def test_cli_refuses_a_missing_model_folder(tmp_path, capsys):
    status, error = run_cli(capsys, "--model", str(tmp_path / "nowhere"), "--output", str(tmp_path / "out"))
    assert_one_line_error(status, error, "nowhere")
    assert not (tmp_path / "out").exists()


def test_cli_refuses_a_non_empty_output_unless_overwrite(tmp_path, capsys):
    folder = model_folder(tmp_path, make_model())
    output = tmp_path / "out"
    output.mkdir()
    (output / "keep.txt").write_text("mine")
    status, error = run_cli(capsys, "--model", str(folder), "--output", str(output))
    assert_one_line_error(status, error, "not empty", "--overwrite")
    assert sorted(p.name for p in output.iterdir()) == ["keep.txt"]
    status = export_marian_main(["--model", str(folder), "--output", str(output), "--overwrite", "--max_positions",
                                 "64"])  # fmt: skip
    assert status == 0 and not (output / "keep.txt").exists() and leftovers(tmp_path) == []
    assert json.loads((output / "config.json").read_text())["max_position_embeddings"] == 64
    assert json.loads((output / "generation_config.json").read_text())["max_length"] == 64  # capped at the table
    assert json.loads((output / "tokenizer_config.json").read_text())["model_max_length"] == 64
    (tmp_path / "empty").mkdir()  # an existing empty folder is fine without --overwrite
    assert export_marian_main(["--model", str(folder), "--output", str(tmp_path / "empty")]) == 0


def test_failure_while_writing_leaves_nothing(tmp_path, monkeypatch):
    folder = model_folder(tmp_path, make_model())

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("vanilla_transformer.marian.exporter.write_tokenizer", fail)
    with pytest.raises(OSError, match="disk full"):
        save_marian(folder, tmp_path / "out")
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_cli_help_and_script(capsys):
    with pytest.raises(SystemExit) as exit_info:
        export_marian_main(["--help"])
    assert exit_info.value.code == 0 and "vt-export-marian --model" in capsys.readouterr().out
    result = subprocess.run([sys.executable, str(ROOT / "export" / "export_marian.py"), "--help"], capture_output=True,
                            text=True, timeout=120, cwd=ROOT)  # fmt: skip
    assert result.returncode == 0 and "--max_positions" in result.stdout
