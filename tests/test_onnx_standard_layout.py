"""The standard ONNX layout (`vt-export-onnx --layout optimum`): graph checks and I/O, a plain onnxruntime greedy loop
against PyTorch `generate()` and logits, the int8 files, bad inputs, and `detect_layout`."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from tests.onnx_helpers import CONFIG, SENTENCES, build_tokenizer, load_trained_model, trained_model_dir
from tests.standard_layout_helpers import STALE_FILE, standard_export_dir
from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.export.cli import export_onnx_main
from vanilla_transformer.export.onnx import merged_decoder as onnx_merged_decoder
from vanilla_transformer.export.onnx.standard_layout import check_exportable, standard_layout_files
from vanilla_transformer_ort.layouts import CTRANSLATE2, OPTIMUM, PYTORCH, UNKNOWN, VANILLA, detect_layout

LAYERS, HEADS, D_MODEL, VOCAB = CONFIG["decoder_layers"], CONFIG["decoder_attention_heads"], CONFIG["d_model"], 37
D_HEAD = D_MODEL // HEADS
START, EOS, PAD = 1, 2, 0
MAX_NEW_TOKENS = 10


def sessions(quantized: bool = False):
    files = standard_layout_files(standard_export_dir(), quantized=quantized)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return tuple(ort.InferenceSession(str(files[role]), options) for role in ("encoder", "decoder"))


def source_batch() -> tuple[np.ndarray, np.ndarray]:
    """SENTENCES tokenized and right-padded: (input_ids, attention_mask), both (5, 11) int64."""
    encoded = build_tokenizer()(SENTENCES, padding=True, return_tensors="np")
    return encoded["input_ids"].astype(np.int64), encoded["attention_mask"].astype(np.int64)


def empty_past(batch: int, heads: int = HEADS, d_head: int = D_HEAD) -> dict[str, np.ndarray]:
    """Zero-length past for every cache input, as consumers feed at the first step."""
    names = onnx_merged_decoder.past_names(LAYERS)
    return {name: np.zeros((batch, heads, 0, d_head), np.float32) for name in names}


def ort_greedy(encoder, decoder, input_ids, attention_mask, past_heads=HEADS, past_d_head=D_HEAD):
    """A plain greedy loop over the two graphs, the way Optimum and transformers.js drive them: step 0 with
    zero-length pasts and use_cache_branch=False, then the presents fed back with use_cache_branch=True (the
    cross-attention K/V kept from step 0). Returns the tokens (batch, 1 + new) and each step's logits (batch, V)."""
    (hidden,) = encoder.run(None, {"input_ids": input_ids, "attention_mask": attention_mask})
    batch = input_ids.shape[0]
    tokens = np.full((batch, 1), START, np.int64)
    finished = np.zeros(batch, bool)
    past, step_logits = empty_past(batch, past_heads, past_d_head), []
    names = [output.name for output in decoder.get_outputs()]
    for step in range(MAX_NEW_TOKENS):
        feed = {
            "encoder_attention_mask": attention_mask,
            "input_ids": tokens[:, -1:],
            "encoder_hidden_states": hidden,
            **past,
            "use_cache_branch": np.array([step > 0]),
        }
        outputs = dict(zip(names, decoder.run(None, feed), strict=True))
        logits = outputs["logits"][:, -1]  # (batch, V)
        step_logits.append(logits)
        next_tokens = np.where(finished, PAD, logits.argmax(-1))
        tokens = np.concatenate([tokens, next_tokens[:, None]], axis=1)
        finished |= next_tokens == EOS
        for name in past:
            if step == 0 or ".decoder." in name:  # the cross K/V of step 0 are kept
                past[name] = outputs[name.replace("past_key_values", "present", 1)]
        if finished.all():
            break
    return tokens, np.stack(step_logits, axis=1)


def torch_greedy(input_ids, attention_mask) -> np.ndarray:
    model = load_trained_model()  # outside no_grad: the first call trains it
    with torch.no_grad():
        return model.generate(
            input_ids=torch.from_numpy(input_ids), attention_mask=torch.from_numpy(attention_mask), num_beams=1,
            do_sample=False, max_new_tokens=MAX_NEW_TOKENS, min_new_tokens=0, decoder_start_token_id=START,
        ).numpy()  # fmt: skip


def torch_logits(input_ids, attention_mask, decoder_input_ids) -> np.ndarray:
    """Teacher-forced logits of a full forward pass: (batch, tgt_len, V)."""
    model = load_trained_model()
    with torch.no_grad():
        return model(
            input_ids=torch.from_numpy(input_ids), attention_mask=torch.from_numpy(attention_mask),
            decoder_input_ids=torch.from_numpy(decoder_input_ids),
        ).logits.numpy()  # fmt: skip


def describe(values) -> list[tuple]:
    rows = []
    for value in values:
        tensor = value.type.tensor_type
        dims = [d.dim_param or d.dim_value for d in tensor.shape.dim]
        rows.append((value.name, onnx.TensorProto.DataType.Name(tensor.elem_type), dims))
    return rows


# ---- graphs and I/O


def test_files_and_config():
    folder = standard_export_dir()
    assert detect_layout(folder) == OPTIMUM
    for name in (
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        assert (folder / name).is_file(), name
    onnx_files = sorted(p.name for p in (folder / "onnx").iterdir())
    # weights inside the graphs: no external data files
    assert onnx_files == [f"{name}{suffix}.onnx" for name in ("decoder_model_merged", "encoder_model")
                          for suffix in ("", "_quantized")]  # fmt: skip
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "marian"
    assert (config["d_model"], config["decoder_layers"], config["decoder_attention_heads"]) == (D_MODEL, LAYERS, HEADS)
    assert not list(folder.parent.glob(".standard.*")), "the staging folder was left behind"


@pytest.mark.parametrize("name", ["encoder_model", "decoder_model_merged", "encoder_model_quantized",
                                  "decoder_model_merged_quantized"])  # fmt: skip
def test_checker_and_io(name):
    path = standard_export_dir() / "onnx" / f"{name}.onnx"
    onnx.checker.check_model(str(path), full_check=True)
    model = onnx.load(str(path))
    assert not any(onnx.external_data_helper.uses_external_data(t) for t in model.graph.initializer)
    if name.startswith("encoder"):
        assert describe(model.graph.input) == [
            ("input_ids", "INT64", ["batch_size", "encoder_sequence_length"]),
            ("attention_mask", "INT64", ["batch_size", "encoder_sequence_length"]),
        ]
        assert describe(model.graph.output) == [
            ("last_hidden_state", "FLOAT", ["batch_size", "encoder_sequence_length", D_MODEL])
        ]
        return
    past = []
    for i in range(LAYERS):
        for part, length in (("decoder", "past_decoder_sequence_length"), ("encoder", "past_encoder_sequence_length")):
            for kind in ("key", "value"):
                past.append((f"past_key_values.{i}.{part}.{kind}", "FLOAT",
                             ["batch_size", "past_num_heads", length, "past_head_size"]))  # fmt: skip
    assert describe(model.graph.input) == [
        ("encoder_attention_mask", "INT64", ["batch_size", "encoder_sequence_length"]),
        ("input_ids", "INT64", ["batch_size", "decoder_sequence_length"]),
        ("encoder_hidden_states", "FLOAT", ["batch_size", "encoder_sequence_length", D_MODEL]),
        *past,
        ("use_cache_branch", "BOOL", [1]),
    ]
    present = []
    for i in range(LAYERS):
        for part, length in (("decoder", "past_decoder_sequence_length + decoder_sequence_length"),
                             ("encoder", "encoder_sequence_length")):  # fmt: skip
            for kind in ("key", "value"):
                present.append((f"present.{i}.{part}.{kind}", "FLOAT", ["batch_size", HEADS, length, D_HEAD]))
    assert describe(model.graph.output) == [
        ("logits", "FLOAT", ["batch_size", "decoder_sequence_length", VOCAB]),
        *present,
    ]
    if name == "decoder_model_merged":  # one If, and the decoder body once (outside it)
        assert [node.op_type for node in model.graph.node].count("If") == 1
        assert sum(node.op_type == "LayerNormalization" for node in model.graph.node) == 3 * LAYERS


# ---- numerics against PyTorch


def test_last_hidden_state_is_the_marian_encoder_output_in_the_interleaved_basis():
    """The folder's MarianMT weights (transformers' own MarianMTModel) and the ONNX encoder agree up to the fixed
    permutation of d_model between Marian's [sin | cos] basis and the paper's interleaved one."""
    from transformers import MarianMTModel

    from vanilla_transformer.marian.importer import interleave_permutation

    input_ids, attention_mask = source_batch()
    (hidden,) = sessions()[0].run(None, {"input_ids": input_ids, "attention_mask": attention_mask})
    marian = MarianMTModel.from_pretrained(standard_export_dir()).eval()
    with torch.no_grad():
        marian_hidden = marian.model.encoder(
            input_ids=torch.from_numpy(input_ids), attention_mask=torch.from_numpy(attention_mask)
        ).last_hidden_state.numpy()  # (batch, src_len, d_model)
    np.testing.assert_allclose(hidden, marian_hidden[..., interleave_permutation(D_MODEL).numpy()], atol=1e-4, rtol=0)
    assert np.abs(hidden - marian_hidden).max() > 0.1, "the two bases differ: this test would notice a permutation"


def test_greedy_loop_matches_generate_and_logits():
    input_ids, attention_mask = source_batch()
    tokens, step_logits = ort_greedy(*sessions(), input_ids, attention_mask)
    expected = torch_greedy(input_ids, attention_mask)
    np.testing.assert_array_equal(tokens, expected)
    assert tokens.shape[1] - 1 >= 3, "the loop ran past the first step (with-past logits are compared too)"
    reference = torch_logits(input_ids, attention_mask, tokens[:, :-1])  # (batch, steps, V)
    np.testing.assert_allclose(step_logits[:, :1], reference[:, :1], atol=1e-4, rtol=0)  # first step, no past
    np.testing.assert_allclose(step_logits[:, 1:], reference[:, 1:], atol=1e-4, rtol=0)  # with past


def test_first_step_ignores_the_size_of_placeholder_pasts():
    """Optimum sizes its step-0 placeholders with the encoder's head count (4 here, the decoder has 2): the first
    step reads none of them, so the result is the same."""
    input_ids, attention_mask = source_batch()
    encoder, decoder = sessions()
    heads = CONFIG["encoder_attention_heads"]
    tokens, step_logits = ort_greedy(encoder, decoder, input_ids, attention_mask, heads, D_MODEL // heads)
    expected_tokens, expected_logits = ort_greedy(encoder, decoder, input_ids, attention_mask)
    np.testing.assert_array_equal(tokens, expected_tokens)
    np.testing.assert_array_equal(step_logits, expected_logits)


def test_prefill_then_several_tokens_with_past():
    """Several decoder tokens at once, at the first step and with a past, against the teacher-forced forward."""
    input_ids, attention_mask = source_batch()
    encoder, decoder = sessions()
    targets = np.random.default_rng(0).integers(4, VOCAB, (input_ids.shape[0], 5))
    targets[:, 0] = START
    (hidden,) = encoder.run(None, {"input_ids": input_ids, "attention_mask": attention_mask})
    names = [output.name for output in decoder.get_outputs()]
    common = {"encoder_attention_mask": attention_mask, "encoder_hidden_states": hidden}
    first_feed = {
        **common,
        "input_ids": targets[:, :3],
        **empty_past(len(targets)),
        "use_cache_branch": np.array([False]),
    }
    first = dict(zip(names, decoder.run(None, first_feed), strict=True))
    past = {name.replace("present", "past_key_values", 1): value for name, value in first.items() if name != "logits"}
    second = decoder.run(None, {**common, "input_ids": targets[:, 3:], **past, "use_cache_branch": np.array([True])})
    reference = torch_logits(input_ids, attention_mask, targets)
    np.testing.assert_allclose(first["logits"], reference[:, :3], atol=1e-4, rtol=0)
    np.testing.assert_allclose(second[0], reference[:, 3:], atol=1e-4, rtol=0)
    np.testing.assert_array_equal(second[names.index("present.0.encoder.key")], first["present.0.encoder.key"])


def test_quantized_files_run_and_mostly_agree():
    input_ids, attention_mask = source_batch()
    tokens, _ = ort_greedy(*sessions(), input_ids, attention_mask)
    int8_tokens, _ = ort_greedy(*sessions(quantized=True), input_ids, attention_mask)
    assert int8_tokens.shape[0] == tokens.shape[0]
    # Teacher-forced on the fp32 tokens: the int8 graphs pick the same next token almost everywhere.
    encoder, decoder = sessions(quantized=True)
    (hidden,) = encoder.run(None, {"input_ids": input_ids, "attention_mask": attention_mask})
    int8_logits = decoder.run(["logits"], {
        "encoder_attention_mask": attention_mask, "input_ids": tokens[:, :-1], "encoder_hidden_states": hidden,
        **empty_past(len(tokens)), "use_cache_branch": np.array([False]),
    })[0]  # fmt: skip
    reference = torch_logits(input_ids, attention_mask, tokens[:, :-1])
    agreement = (int8_logits.argmax(-1) == reference.argmax(-1)).mean()
    assert agreement >= 0.9, agreement
    assert np.abs(int8_logits - reference).max() < 0.5 * np.abs(reference).max()
    fp32, int8 = standard_layout_files(standard_export_dir()), standard_layout_files(standard_export_dir(), True)
    for role in ("encoder", "decoder"):
        assert int8[role].stat().st_size < fp32[role].stat().st_size, role


# ---- bad input: exit status 2, one line, nothing left behind


def run_export(capsys, *argv) -> tuple[int, str]:
    status = export_onnx_main([str(arg) for arg in argv])
    err = capsys.readouterr().err.strip()
    return status, err


def assert_one_line_error(status: int, err: str, *fragments: str) -> None:
    """Exit status 2 and one error line, the last on stderr (transformers' loading progress bar may precede it)."""
    assert status == 2, err
    lines = err.splitlines()
    assert len([line for line in lines if "error" in line.lower()]) == 1, err
    assert lines[-1].startswith("vt-export-onnx: error: "), err
    err = lines[-1]
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def entries(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("layout", ["vanilla", "optimum"])
def test_refuses_a_non_empty_output_folder_unless_overwrite(tmp_path, capsys, layout):
    output = tmp_path / "out"
    output.mkdir()
    (output / "keep.txt").write_text("mine")
    status, err = run_export(capsys, "--model", trained_model_dir(), "--output", output, "--layout", layout)
    assert_one_line_error(status, err, "exists and is not empty", "--overwrite")
    assert entries(tmp_path) == ["out"] and entries(output) == ["keep.txt"]


def test_a_failed_export_leaves_the_old_folder_untouched(tmp_path, capsys, monkeypatch):
    output = tmp_path / "out"
    output.mkdir()
    (output / "keep.txt").write_text("mine")

    def fail(*args, **kwargs):
        raise ValueError("simulated failure in the middle of the export")

    monkeypatch.setattr(onnx_merged_decoder, "export_encoder", fail)  # after the config and tokenizer are written
    status, err = run_export(capsys, "--model", trained_model_dir(), "--output", output, "--layout", "optimum",
                             "--overwrite")  # fmt: skip
    assert_one_line_error(status, err, "simulated failure")
    assert entries(tmp_path) == ["out"] and entries(output) == ["keep.txt"], "a half-written folder was left"


def test_overwrite_replaced_a_non_empty_folder():
    """`standard_export_dir()` was exported with overwrite=True over a folder holding a stale file."""
    folder = standard_export_dir()
    assert not (folder / STALE_FILE).exists()
    assert entries(folder.parent).count(folder.name) == 1
    assert not [name for name in entries(folder.parent) if name.startswith(".")], "staging or replaced folder left"


def test_model_folder_without_tokenizer(tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(trained_model_dir(), model)
    (model / "tokenizer.json").unlink()
    status, err = run_export(capsys, "--model", model, "--output", tmp_path / "out", "--layout", "optimum")
    assert_one_line_error(status, err, "no tokenizer.json", "--tokenizer")
    assert entries(tmp_path) == ["model"]


def test_pre_ln_model_is_refused(tmp_path, capsys):
    model = tmp_path / "pre-ln"
    VanillaTransformerForConditionalGeneration(
        VanillaTransformerConfig(**CONFIG, normalize_before=True)
    ).save_pretrained(model)
    build_tokenizer().save_pretrained(model)
    status, err = run_export(capsys, "--model", model, "--output", tmp_path / "out", "--layout", "optimum")
    assert_one_line_error(status, err, "pre-LN", "MarianMT", "vanilla layout")
    assert entries(tmp_path) == ["pre-ln"]


def test_model_marian_cannot_describe_is_refused(tmp_path, capsys):
    model = tmp_path / "eps"
    config = VanillaTransformerConfig(**CONFIG, layer_norm_eps=1e-6)
    VanillaTransformerForConditionalGeneration(config).save_pretrained(model)
    build_tokenizer().save_pretrained(model)
    status, err = run_export(capsys, "--model", model, "--output", tmp_path / "out", "--layout", "optimum")
    assert_one_line_error(status, err, "layer_norm_eps", "vanilla layout")
    assert entries(tmp_path) == ["eps"]


@pytest.mark.parametrize("option", [["--decoder_cache", "copy"], ["--int8_activations", "tensor"],
                                    ["--dtype", "fp16"], ["--validate"], ["--tolerance", "1e-3"]])  # fmt: skip
def test_vanilla_only_options_are_refused_with_the_standard_layout(tmp_path, capsys, option):
    status, err = run_export(capsys, "--model", trained_model_dir(), "--output", tmp_path / "o", "--layout", "optimum",
                             *option)  # fmt: skip
    assert_one_line_error(status, err, option[0], "--layout vanilla only")
    assert entries(tmp_path) == []


def test_graph_over_two_gigabytes_is_refused():
    with pytest.raises(ValueError, match="cannot exceed 2 GB"):
        check_exportable(load_trained_model(), limit=16 * 2**20 + 1000)
    check_exportable(load_trained_model())


# ---- which layout a folder is


def fake_folder(root, name: str, files: dict[str, str]):
    folder = root / name
    for relative, text in files.items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_text(text)
    return folder


def test_detect_layout(tmp_path):
    manifest = json.dumps({"format": "vanilla-transformer-onnx"})
    cases = {
        VANILLA: {"manifest.json": manifest, "config.json": "{}", "encoder_model.onnx": "", "decoder_model.onnx": ""},
        OPTIMUM: {"config.json": "{}", "onnx/decoder_model_merged.onnx": "", "onnx/encoder_model.onnx": ""},
        PYTORCH: {"config.json": "{}", "model.safetensors": ""},
        CTRANSLATE2: {"config.json": "{}", "model.bin": "", "shared_vocabulary.json": "[]"},
        UNKNOWN: {"notes.txt": ""},
    }
    for expected, files in cases.items():
        assert detect_layout(fake_folder(tmp_path, expected, files)) == expected
    # A complete standard layout carries the MarianMT weights too: still the standard layout.
    complete = {**cases[OPTIMUM], "model.safetensors": ""}
    assert detect_layout(fake_folder(tmp_path, "complete", complete)) == OPTIMUM
    old = {"encoder_model.onnx": "", "decoder_model.onnx": "", "config.json": "{}"}  # before manifest.json
    assert detect_layout(fake_folder(tmp_path, "old", old)) == VANILLA
    assert detect_layout(tmp_path / "missing") == UNKNOWN
    assert detect_layout(trained_model_dir()) == PYTORCH


def test_vanilla_layout_where_the_standard_one_is_expected(tmp_path):
    manifest = json.dumps({"format": "vanilla-transformer-onnx"})
    folder = fake_folder(tmp_path, "vanilla", {"manifest.json": manifest, "config.json": "{}"})
    with pytest.raises(ValueError) as error:
        standard_layout_files(folder)
    message = str(error.value)
    assert "\n" not in message and "this runtime's layout" in message
    assert "vt-export-onnx --layout optimum --model MODEL --output OUT" in message


def test_runtime_given_the_standard_layout_names_it_and_the_command(capsys):
    from vanilla_transformer_ort import OrtTranslator
    from vanilla_transformer_ort.cli import main as translate_main

    with pytest.raises(ValueError, match="standard layout of Optimum") as error:
        OrtTranslator(standard_export_dir())
    assert "vt-export-onnx --model MODEL --output OUT" in str(error.value)
    assert translate_main(["--model", str(standard_export_dir()), "a b"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "standard layout" in err and "vt-export-onnx --model MODEL --output OUT" in err
