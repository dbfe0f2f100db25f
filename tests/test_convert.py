"""MarianMT import: the converted model computes what MarianMTModel computes (logits, greedy, beam 4), refuses what
it cannot reproduce, saves a folder that loads, fine-tunes and exports, and the torch-free runtime translates like
MarianMTModel with Marian's sentencepiece tokenizer."""

import csv
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, MarianConfig, MarianMTModel, MarianTokenizer

import vanilla_transformer  # noqa: F401  (registers the Auto classes)
from tests.training_fixtures import *  # noqa: F403 (pytest fixtures: toy_data_dir)
from vanilla_transformer.marian.importer import (
    config_from_marian,
    convert_marian,
    interleave_permutation,
    save_converted,
    verify_conversion,
)
from vanilla_transformer.model.embeddings import sinusoidal_positional_encoding

spm = pytest.importorskip("sentencepiece")

GETTEXT = Path("/work/shared/data/gettext-en-de")
TINY_MARIAN = dict(
    d_model=16, encoder_layers=2, decoder_layers=3, encoder_attention_heads=4, decoder_attention_heads=2,
    encoder_ffn_dim=24, decoder_ffn_dim=20, activation_function="swish", scale_embedding=True,
    max_position_embeddings=512, dropout=0.0, eos_token_id=0, bos_token_id=None, forced_eos_token_id=0,
)  # fmt: skip
# (name, share_encoder_decoder_embeddings, tie_word_embeddings)
CONFIGURATIONS = [("shared", True, True), ("separate", False, True), ("untied", True, False)]


def read_pairs(path: Path, limit: int | None = None) -> list[tuple[str, str]]:
    with path.open(encoding="utf-8") as handle:
        rows = [(row["en"], row["de"]) for row in csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)]
    return rows[:limit]


def corpus() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(training pairs for the sentencepiece models, test pairs): the gettext corpus when present, else a toy one."""
    if (GETTEXT / "train.tsv").is_file():
        return read_pairs(GETTEXT / "train.tsv", 400), read_pairs(GETTEXT / "test.tsv")
    from tests.training_fixtures import make_pairs

    pairs = make_pairs(500, seed=3)
    return pairs[:400], pairs[400:]


def build_tokenizer(folder: Path, separate: bool) -> MarianTokenizer:
    """A tiny OPUS-MT-style tokenizer: two unigram sentencepiece models and a vocab.json that leaves some pieces out
    (they become <unk>, as in Marian); `</s>` is 0, `<unk>` 1 and `<pad>` the last id (or 2 with separate vocabs)."""
    folder.mkdir(parents=True, exist_ok=True)
    train, _ = corpus()
    pieces = {}
    for side, column in (("source", 0), ("target", 1)):
        text = folder / f"{side}.txt"
        text.write_text("\n".join(pair[column] for pair in train) + "\n", encoding="utf-8")
        spm.SentencePieceTrainer.train(
            input=str(text), model_prefix=str(folder / side), vocab_size=150, model_type="unigram",
            character_coverage=1.0, minloglevel=2,
        )  # fmt: skip
        (folder / f"{side}.model").rename(folder / f"{side}.spm")
        processor = spm.SentencePieceProcessor(model_file=str(folder / f"{side}.spm"))
        pieces[side] = [processor.IdToPiece(i) for i in range(3, processor.GetPieceSize())]  # no <unk>, <s>, </s>

    def vocab_of(*sides: str) -> dict[str, int]:
        vocab = {"</s>": 0, "<unk>": 1}
        if separate:
            vocab["<pad>"] = 2
        for side in sides:
            for index, piece in enumerate(pieces[side]):
                if index % 13 != 5 and piece not in vocab:  # leave some pieces out: they map to <unk>
                    vocab[piece] = len(vocab)
        vocab.setdefault("<pad>", len(vocab))
        return vocab

    extra = {}
    if separate:
        (folder / "vocab.json").write_text(json.dumps(vocab_of("source")), encoding="utf-8")
        (folder / "target_vocab.json").write_text(json.dumps(vocab_of("target")), encoding="utf-8")
        extra = dict(separate_vocabs=True, target_vocab_file=str(folder / "target_vocab.json"))
    else:
        (folder / "vocab.json").write_text(json.dumps(vocab_of("source", "target")), encoding="utf-8")
    return MarianTokenizer(
        str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json"),
        source_lang="en", target_lang="de", **extra,
    )  # fmt: skip


def build_marian(tokenizer: MarianTokenizer, share: bool, tie: bool = True, seed: int = 0) -> MarianMTModel:
    """A random MarianMTModel with tiny, deliberately unequal dims and a random non-zero final_logits_bias."""
    vocab_size = len(tokenizer.encoder)
    target_size = len(tokenizer.target_encoder) if tokenizer.separate_vocabs else vocab_size
    pad = tokenizer.pad_token_id
    config = MarianConfig(
        **TINY_MARIAN, vocab_size=vocab_size, decoder_vocab_size=target_size, share_encoder_decoder_embeddings=share,
        tie_word_embeddings=tie, pad_token_id=pad, decoder_start_token_id=pad,
    )  # fmt: skip
    torch.manual_seed(seed)
    model = MarianMTModel(config).eval()
    with torch.no_grad():  # weights large enough that outputs differ per sentence
        for name, parameter in model.named_parameters():
            if "layer_norm" not in name and "embed_positions" not in name:
                parameter.normal_(0.0, 0.3 if parameter.dim() == 2 else 0.1)
        for embedding in (model.get_input_embeddings(), model.model.decoder.embed_tokens):
            embedding.weight[pad] = 0.0  # Marian's pad row, the decoder's start, is zero
        model.final_logits_bias.normal_(0.0, 0.5)
    generation = model.generation_config
    generation.bad_words_ids, generation.num_beams, generation.max_length = [[pad]], 4, 24
    generation.renormalize_logits = tie  # on in two configurations, off in one
    return model


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> dict[bool, MarianTokenizer]:
    root = tmp_path_factory.mktemp("marian_tokenizers")
    return {separate: build_tokenizer(root / f"separate_{separate}", separate) for separate in (False, True)}


@pytest.fixture(scope="module", params=CONFIGURATIONS, ids=[c[0] for c in CONFIGURATIONS])
def pair(request, tokenizers):
    """(configuration name, MarianMTModel, converted model, tokenizer)."""
    name, share, tie = request.param
    tokenizer = tokenizers[not share]
    marian = build_marian(tokenizer, share, tie)
    model, report = convert_marian(marian)
    return name, marian, model, tokenizer, report


def source_batch(tokenizer: MarianTokenizer, count: int = 4):
    _, test = corpus()
    texts = [source for source, _ in test[:count]]
    return texts, tokenizer(texts, return_tensors="pt", padding=True)


def test_permutation_turns_marian_halves_into_interleaved_pairs():
    d_model, positions = 10, torch.arange(7)
    angles = positions[:, None].float() / 10000 ** (torch.arange(0, d_model, 2).float() / d_model)
    marian = torch.cat([angles.sin(), angles.cos()], dim=1)  # [sin | cos], MarianSinusoidalPositionalEmbedding
    ours = sinusoidal_positional_encoding(positions, d_model)
    torch.testing.assert_close(marian[:, interleave_permutation(d_model)], ours, atol=1e-6, rtol=0)


def test_logits_equal_marian(pair):
    name, marian, model, tokenizer, report = pair
    assert report.position_table_max_diff < 1e-5
    texts, batch = source_batch(tokenizer)
    assert (batch["attention_mask"] == 0).any()  # padded rows included
    target = tokenizer(text_target=[t for t, _ in corpus()[1][:4]], return_tensors="pt", padding=True)["input_ids"]
    decoder_input_ids = marian.prepare_decoder_input_ids_from_labels(target)
    with torch.no_grad():
        expected = marian(**batch, decoder_input_ids=decoder_input_ids).logits
        actual = model(**batch, decoder_input_ids=decoder_input_ids).logits
    difference = float((expected - actual).abs().max())
    print(f"max |Δlogits| ({name}): {difference:.2e}")
    assert difference < 1e-4
    assert verify_conversion(marian, model) < 1e-4
    assert model.generation_config.bad_words_ids == [[tokenizer.pad_token_id]]


@pytest.mark.parametrize("num_beams", [1, 4])
def test_generation_is_token_identical(pair, num_beams):
    _, marian, model, tokenizer, _ = pair
    _, batch = source_batch(tokenizer, count=6)
    with torch.no_grad():
        expected = marian.generate(**batch, num_beams=num_beams, max_new_tokens=20)
        actual = model.generate(**batch, num_beams=num_beams, max_new_tokens=20)
    assert actual.tolist() == expected.tolist()
    assert len({tuple(row) for row in expected.tolist()}) > 1  # not one degenerate output for every row


def test_state_dict_layout_mirrors_marian(pair):
    name, marian, model, _, report = pair
    ours = set(model.state_dict())
    theirs = {k for k in marian.state_dict() if not k.endswith("embed_positions.weight")}
    assert ours == theirs
    assert set(report.tensors) == ours
    assert report.recomputed == ["model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"]
    tied = model.lm_head.weight is model.get_output_embeddings().weight
    assert tied
    if name == "separate":
        assert model.lm_head.weight is model.model.decoder.embed_tokens.weight
        assert not hasattr(model.model, "shared")
    if name == "untied":
        assert model.lm_head.weight is not model.model.shared.weight
    assert model.final_logits_bias.abs().max() > 0


def test_refused_fields_name_them(tokenizers):
    base = dict(TINY_MARIAN, vocab_size=40, pad_token_id=39, decoder_start_token_id=39)
    for overrides, field in [
        (dict(activation_function="gelu_new"), "activation_function"),
        (dict(encoder_layerdrop=0.1), "encoder_layerdrop"),
        (dict(decoder_layerdrop=0.2), "decoder_layerdrop"),
    ]:
        with pytest.raises(ValueError, match=f"MarianConfig.{field}="):
            config_from_marian(MarianConfig(**{**base, **overrides}))
    with pytest.raises(ValueError, match="Expected a MarianConfig"):
        config_from_marian(vanilla_transformer.VanillaTransformerConfig())

    marian = build_marian(tokenizers[False], share=True)
    marian.register_buffer("unexpected_scale", torch.ones(3))
    with pytest.raises(ValueError, match="unexpected_scale"):  # no tensor may be dropped silently
        convert_marian(marian)


def test_separate_vocabularies_config_is_validated():
    with pytest.raises(ValueError, match="`decoder_vocab_size`"):
        vanilla_transformer.VanillaTransformerConfig(vocab_size=50, decoder_vocab_size=40)
    config = vanilla_transformer.VanillaTransformerConfig(
        vocab_size=50, decoder_vocab_size=40, share_encoder_decoder_embeddings=False, pad_token_id=3
    )
    assert config.target_vocab_size == 40
    with pytest.raises(ValueError, match="`decoder_start_token_id`"):
        vanilla_transformer.VanillaTransformerConfig(
            vocab_size=50, decoder_vocab_size=40, share_encoder_decoder_embeddings=False, decoder_start_token_id=45
        )
    with pytest.raises(ValueError, match="`decoder_vocab_size`"):
        vanilla_transformer.VanillaTransformerConfig(share_encoder_decoder_embeddings=False, decoder_vocab_size=0)


def test_defaults_keep_the_paper_model():
    config = vanilla_transformer.VanillaTransformerConfig.from_preset("tiny", vocab_size=37)
    assert (config.add_final_logits_bias, config.share_encoder_decoder_embeddings) == (False, True)
    assert config.decoder_vocab_size == config.vocab_size == config.target_vocab_size
    model = vanilla_transformer.VanillaTransformerForConditionalGeneration(config)
    assert model.final_logits_bias is None and "final_logits_bias" not in model.state_dict()


# ---------------------------------------------------------------------------------------------------------------
# Tokenizer: the runtime's sentencepiece tokenizer gives MarianTokenizer's ids and text
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("separate", [False, True], ids=["joint_vocab", "separate_vocabs"])
def test_runtime_tokenizer_equals_marian_tokenizer(tokenizers, tmp_path, separate):
    from vanilla_transformer_ort.marian_tokenizer import MarianSentencePieceTokenizer

    tokenizer = tokenizers[separate]
    tokenizer.save_pretrained(tmp_path)
    runtime = MarianSentencePieceTokenizer(tmp_path)
    _, test = corpus()
    sources = [source for source, _ in test] + [">>de<< hello there", "", "  two  spaces  ", "Ünïcödé ½ ™"]
    expected = tokenizer(sources)["input_ids"]
    assert [e.ids for e in runtime.encode_batch(sources)] == expected
    assert any(tokenizer.unk_token_id in ids for ids in expected)  # pieces outside vocab.json became <unk>
    targets = tokenizer(text_target=[target for _, target in test])["input_ids"]
    targets = [[tokenizer.pad_token_id, *ids, tokenizer.pad_token_id] for ids in targets]  # as generate returns
    assert runtime.decode_batch(targets) == tokenizer.batch_decode(targets, skip_special_tokens=True)


# ---------------------------------------------------------------------------------------------------------------
# The saved folder: loads, loads as remote code, fine-tunes, exports, translates without torch
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def converted_dirs(tmp_path_factory, tokenizers) -> dict[str, tuple[Path, MarianMTModel, MarianTokenizer]]:
    root = tmp_path_factory.mktemp("converted")
    dirs = {}
    for name, share, tie in CONFIGURATIONS[:2]:
        tokenizer = tokenizers[not share]
        marian = build_marian(tokenizer, share, tie, seed=5)
        report = save_converted(marian, root / name, tokenizer=tokenizer)
        assert report.max_abs_logit_diff < 1e-4
        dirs[name] = (root / name, marian, tokenizer)
    return dirs


def test_saved_folder_loads_with_auto_classes(converted_dirs):
    folder, marian, _ = converted_dirs["separate"]
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    assert type(model).__name__ == "VanillaTransformerForConditionalGeneration"
    assert verify_conversion(marian, model) < 1e-4
    assert type(AutoTokenizer.from_pretrained(folder)).__name__ == "MarianTokenizer"
    generation = json.loads((folder / "generation_config.json").read_text())
    pad = marian.config.pad_token_id
    assert generation["bad_words_ids"] == [[pad]] and generation["decoder_start_token_id"] == pad
    assert generation["num_beams"] == 4 and generation["forced_eos_token_id"] == 0


REMOTE_CODE = textwrap.dedent(
    """
    import json, sys
    sys.modules["vanilla_transformer"] = None  # the package is not installed
    import torch
    from transformers import AutoModelForSeq2SeqLM
    model = AutoModelForSeq2SeqLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
    ids = torch.tensor(json.loads(sys.argv[2]))
    with torch.no_grad():
        print(json.dumps(model.generate(ids, num_beams=4, max_new_tokens=12).tolist()))
    """
)


def test_saved_folder_loads_as_remote_code(converted_dirs, tmp_path):
    folder, marian, tokenizer = converted_dirs["separate"]
    shutil.copytree(folder, tmp_path / "hub_copy")
    (tmp_path / "check.py").write_text(REMOTE_CODE)
    ids = tokenizer(["The file was not found."], return_tensors="pt")["input_ids"]
    result = subprocess.run(
        [sys.executable, "-I", str(tmp_path / "check.py"), str(tmp_path / "hub_copy"), json.dumps(ids.tolist())],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    with torch.no_grad():
        expected = marian.generate(ids, num_beams=4, max_new_tokens=12)
    assert json.loads(result.stdout.strip().splitlines()[-1]) == expected.tolist()


def test_converted_folder_fine_tunes(converted_dirs, tmp_path, toy_data_dir):
    from tests.test_scripts import command

    folder, _, _ = converted_dirs["shared"]
    files = [f"--{kind}_file={toy_data_dir / name}.tsv" for kind, name in
             (("train", "train"), ("validation", "valid"), ("test", "test"))]  # fmt: skip
    run = tmp_path / "run"
    results = command("train")([
        *files, "--model_name_or_path", str(folder), "--output_dir", str(run), "--do_train", "--max_steps", "3",
        "--warmup_steps", "1", "--learning_rate", "1e-3", "--max_tokens", "256", "--max_train_samples", "64",
        "--report_to", "none", "--use_cpu", "--disable_tqdm", "true", "--save_strategy", "no",
    ])  # fmt: skip
    assert results["train_loss"] > 0
    tuned = AutoModelForSeq2SeqLM.from_pretrained(run)
    assert tuned.config.add_final_logits_bias and tuned.final_logits_bias.abs().max() > 0
    assert (run / "source.spm").is_file() and (run / "vocab.json").is_file()


@pytest.mark.parametrize("name", ["separate", pytest.param("shared", marks=pytest.mark.slow)])
def test_onnx_runtime_translates_like_marian(converted_dirs, tmp_path, name):
    """Export (minutes on a busy 2-core machine: the shared-vocabulary variant, with the validation grid, is slow)."""
    from vanilla_transformer.export.onnx.export import export_model
    from vanilla_transformer.export.onnx.validation import validate_folder
    from vanilla_transformer_ort import OrtTranslator

    folder, marian, tokenizer = converted_dirs[name]
    export_model(folder, tmp_path / "onnx")
    if name == "shared":
        validate_folder(folder, tmp_path / "onnx")
    translator = OrtTranslator(tmp_path / "onnx", provider="cpu")
    texts, batch = source_batch(tokenizer, count=5)
    input_ids, attention_mask = translator.encode(texts)
    assert input_ids.tolist() == batch["input_ids"].tolist()
    for num_beams in (1, 4):
        with torch.no_grad():
            expected = marian.generate(**batch, num_beams=num_beams, max_new_tokens=20)
        actual = translator.generate(input_ids, attention_mask, num_beams=num_beams, max_new_tokens=20)
        assert actual.tolist() == expected.tolist(), num_beams
        texts_out = translator.translate(texts, num_beams=num_beams, max_new_tokens=20)
        assert texts_out == tokenizer.batch_decode(expected, skip_special_tokens=True)


# ---------------------------------------------------------------------------------------------------------------
# The real checkpoint (network; run with -m hub)
# ---------------------------------------------------------------------------------------------------------------

HUB_ID = "Helsinki-NLP/opus-mt-en-de"
HUB_SENTENCES = [
    "The file could not be opened.",
    "Do you want to save the changes?",
    "Authentication failure",
    "The printer is out of paper.",
    "Please restart the application.",
    "No network connection is available.",
    "Select a folder to import.",
    "The password is incorrect.",
    "Downloading updates…",
    "Are you sure you want to delete this item?",
]


def hub_reachable() -> bool:
    import os
    import socket

    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=5).close()
    except OSError:
        return False
    return True


@pytest.mark.hub
def test_opus_mt_en_de_translates_like_marian(tmp_path):
    if not hub_reachable():
        pytest.skip("the Hugging Face Hub is offline or unreachable")
    save_converted(HUB_ID, tmp_path / "converted")
    marian = MarianMTModel.from_pretrained(HUB_ID).eval()
    tokenizer = MarianTokenizer.from_pretrained(HUB_ID)
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "converted").eval()
    batch = tokenizer(HUB_SENTENCES, return_tensors="pt", padding=True)
    assert verify_conversion(marian, model) < 1e-3
    with torch.no_grad():
        expected = marian.generate(**batch)
        actual = model.generate(**batch)
    assert tokenizer.batch_decode(actual, skip_special_tokens=True) == tokenizer.batch_decode(
        expected, skip_special_tokens=True
    )


def test_runtime_reads_marian_generation_settings(tmp_path):
    from vanilla_transformer_ort.translator import settings_from_folder

    (tmp_path / "config.json").write_text(json.dumps({"decoder_start_token_id": 9, "eos_token_id": 0}))
    generation = {"bad_words_ids": [[9], [0]], "renormalize_logits": True, "pad_token_id": 9}
    (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    settings = settings_from_folder(tmp_path)
    assert settings.banned_token_ids == [9] and settings.renormalize_logits  # an EOS "bad word" is dropped
    generation["bad_words_ids"] = [[9], [4, 5]]
    (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    with pytest.raises(ValueError, match="bad_words_ids"):
        settings_from_folder(tmp_path)


def test_convert_script_help(capsys):
    from tests.test_scripts import command

    with pytest.raises(SystemExit) as exit_info:
        command("convert_marian")(["--help"])
    assert exit_info.value.code == 0 and "--model" in capsys.readouterr().out


def test_convert_script_from_a_marian_folder(tokenizers, tmp_path, capsys):
    from tests.test_scripts import command

    tokenizer = tokenizers[False]
    marian = build_marian(tokenizer, share=True)
    marian.save_pretrained(tmp_path / "marian")
    tokenizer.save_pretrained(tmp_path / "marian")
    arguments = ["--model", str(tmp_path / "marian"), "--output", str(tmp_path / "out")]
    report = command("convert_marian")(arguments)
    assert report.max_abs_logit_diff < 1e-4 and "max |logits - MarianMTModel logits|" in capsys.readouterr().out
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "out")
    assert verify_conversion(marian, model) < 1e-4
