"""Bad inputs at every entry point: each row is a call, the exception it must raise and words its message must hold.

Entry points: the Python API (config, model, data, resume), every script under scripts/ and export/ (through their
`main(argv)`), and `OrtTranslator`; kinds: missing, empty, malformed, wrong type, out of range, contradictory. A
script that reports an error by its exit status counts as `ScriptExit`, with its stderr as the message. One tiny
model, its tokenizer and its ONNX export are shared by all rows (tests/onnx_helpers.py).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from huggingface_hub.errors import StrictDataclassFieldValidationError

from tests.onnx_helpers import load_trained_model, trained_export_dir, trained_model_dir
from tests.training_fixtures import *  # noqa: F403 (pytest fixtures)
from vanilla_transformer import VanillaTransformerConfig
from vanilla_transformer.training.experiment import parse_config_overrides
from vanilla_transformer.training.pair_reader import read_parallel_file
from vanilla_transformer.training.recipe import check_precision_flags
from vanilla_transformer.training.trainer import resolve_resume_checkpoint
from vanilla_transformer_ort import OrtTranslator

ROOT = Path(__file__).resolve().parents[1]


class ScriptExit(Exception):
    """A script's non-zero exit status; the message is what it wrote to stderr."""


def script(target: str, *argv: str):
    """A row's call: run `target` (`module:function`, a command or a console script) with `{name}` in argv filled
    from the context."""

    def call(ctx):
        module_name, _, function_name = target.partition(":")
        function = getattr(importlib.import_module(module_name), function_name)
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            try:
                status = function([arg.format(**vars(ctx)) for arg in argv])
            except SystemExit as exit_info:  # argparse's parser.error
                status = exit_info.code
        if isinstance(status, int) and status != 0:
            raise ScriptExit(f"exit {status}: {stderr.getvalue()}")

    return call


def command(name: str, *argv: str):
    """A row's call of the command `vt-<name>` (`vanilla_transformer.cli.<name>_command`)."""
    return script(f"vanilla_transformer.cli:{name}_command", *argv)


EXPORT_ONNX = "vanilla_transformer.export.cli:export_onnx_main"
EXPORT_CT2 = "vanilla_transformer.export.cli:export_ctranslate2_main"
EXPORT_MARIAN = "vanilla_transformer.marian.cli:export_marian_main"
PUSH_TO_HUB = "vanilla_transformer.hub.cli:push_to_hub_command"


def ort_main(*argv: str):
    def call(ctx):
        from vanilla_transformer_ort.__main__ import main

        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            try:
                status = main([arg.format(**vars(ctx)) for arg in argv])
            except SystemExit as exit_info:  # argparse's parser.error
                status = exit_info.code
        if status != 0:
            raise ScriptExit(f"exit {status}: {stderr.getvalue()}")

    return call


def ids(*shape, value=5):
    return torch.full(shape, value, dtype=torch.long)


TRAIN = ("vanilla_transformer.cli:train_command", "--tokenizer_name", "{tokenizer_dir}", "--output_dir", "{tmp}/run",
         "--use_cpu", "--report_to", "none", "--train_file", "{data_dir}/train.tsv")  # fmt: skip

# (id, call(ctx), exception, words the message must contain)
ROWS = [
    # ---- config
    ("config/typo", lambda c: VanillaTransformerConfig.from_preset("tiny", dropuot=0.3), ValueError,
     ["'dropuot'", "did you mean 'dropout'"]),
    ("config/unknown-preset", lambda c: VanillaTransformerConfig.from_preset("huge"), ValueError,
     ["'huge'", "base, big, small, tiny"]),
    ("config/wrong-type", lambda c: VanillaTransformerConfig.from_preset("tiny", vocab_size="big"),
     StrictDataclassFieldValidationError, ["vocab_size", "expected int"]),
    ("config/out-of-range", lambda c: VanillaTransformerConfig.from_preset("tiny", dropout=1.5), ValueError,
     ["`dropout`", "[0, 1)"]),
    ("config/contradictory-heads", lambda c: VanillaTransformerConfig(d_model=64, encoder_attention_heads=5),
     ValueError, ["divisible", "encoder_attention_heads"]),
    ("config/saved-without-vocab_size", lambda c: VanillaTransformerConfig.from_pretrained(c.no_vocab_dir),
     ValueError, ["lacks `vocab_size`", "config.json"]),
    ("config/overrides-typo", lambda c: parse_config_overrides("dropout=0.2,encoder_layer=4"), ValueError,
     ["--config_overrides", "'encoder_layer'", "'encoder_layers'"]),
    ("config/overrides-malformed", lambda c: parse_config_overrides("dropout"), ValueError, ["name=value"]),
    ("config/overrides-empty-name", lambda c: parse_config_overrides("=3"), ValueError, ["name=value"]),
    # ---- model forward / generate
    ("model/empty-batch", lambda c: c.model(input_ids=ids(0, 4), decoder_input_ids=ids(0, 1)), ValueError,
     ["`input_ids` is empty", "(0, 4)"]),
    ("model/zero-length-source", lambda c: c.model(input_ids=ids(2, 0), decoder_input_ids=ids(2, 1)), ValueError,
     ["`input_ids` is empty", "(2, 0)"]),
    ("model/zero-length-target", lambda c: c.model(input_ids=ids(2, 3), decoder_input_ids=ids(2, 0)), ValueError,
     ["`decoder_input_ids` is empty"]),
    ("model/labels-batch", lambda c: c.model(input_ids=ids(2, 3), labels=ids(3, 4)), ValueError,
     ["`labels` has batch size 3", "inputs have 2"]),
    ("model/decoder-batch", lambda c: c.model(input_ids=ids(2, 3), decoder_input_ids=ids(3, 1)), ValueError,
     ["batch size 3", "encoder output 2"]),
    ("model/labels-rank", lambda c: c.model(input_ids=ids(2, 3), labels=ids(4)), ValueError,
     ["`labels` must have shape (batch, length)"]),
    ("model/ids-wrong-type", lambda c: c.model(input_ids=[[5, 6]], labels=ids(1, 2)), ValueError,
     ["`input_ids`", "LongTensor", "list"]),
    ("model/ids-float", lambda c: c.model(input_ids=torch.ones(1, 3), labels=ids(1, 2)), ValueError,
     ["integer token ids", "float32"]),
    ("model/ids-out-of-vocab", lambda c: c.model(input_ids=ids(1, 3, value=99), labels=ids(1, 2)), ValueError,
     ["outside the vocabulary [0, 37)"]),
    ("model/mask-shape", lambda c: c.model(input_ids=ids(2, 3), attention_mask=ids(2, 4, value=1), labels=ids(2, 2)),
     ValueError, ["`attention_mask` has shape (2, 4)"]),
    ("model/no-decoder-input", lambda c: c.model(input_ids=ids(2, 3)), ValueError, ["decoder_input_ids", "labels"]),
    ("generate/num_beams-0", lambda c: c.model.generate(ids(1, 3), num_beams=0), ValueError,
     ["`num_beams` must be an integer >= 1", "0"]),
    ("generate/max_new_tokens-0", lambda c: c.model.generate(ids(1, 3), max_new_tokens=0), ValueError,
     ["`max_new_tokens`", ">= 1"]),
    ("generate/empty-batch", lambda c: c.model.generate(ids(0, 3)), ValueError, ["`input_ids` is empty"]),
    # ---- data files
    ("data/tsv-extra-field", lambda c: read_parallel_file(c.extra_field_tsv, "en", "de"), ValueError,
     ["extra_field.tsv:3", "3 tab-separated fields", "header has 2"]),
    ("data/csv-extra-field", lambda c: read_parallel_file(c.extra_field_csv, "en", "de"), ValueError,
     ["extra_field.csv:2", "3 comma-separated fields", "quote that field"]),
    ("data/not-utf8", lambda c: read_parallel_file(c.latin1_tsv, "en", "de"), ValueError,
     ["latin1.tsv:3", "0xe9", "not UTF-8"]),
    ("data/moses-not-utf8", lambda c: read_parallel_file(c.latin1_moses, "en", "de"), ValueError,
     ["moses.de:2", "not UTF-8"]),
    ("data/missing-file", lambda c: read_parallel_file(c.tmp / "nope.tsv", "en", "de"), FileNotFoundError,
     ["nope.tsv", "not found", "check the path"]),
    ("data/wrong-columns", lambda c: read_parallel_file(c.data_dir / "train.tsv", "en", "fr"), ValueError,
     ["'fr'", "--source_lang/--target_lang"]),
    ("data/empty-file", lambda c: read_parallel_file(c.empty_tsv, "en", "de"), ValueError, ["expected columns"]),
    ("data/jsonl-malformed", lambda c: read_parallel_file(c.bad_jsonl, "en", "de"), ValueError,
     ["bad.jsonl:2", "not valid JSON"]),
    ("data/jsonl-wrong-type", lambda c: read_parallel_file(c.number_jsonl, "en", "de"), ValueError,
     ["number.jsonl:1", "expected text", "int"]),
    # ---- resuming
    ("resume/true-without-checkpoint", lambda c: resolve_resume_checkpoint("True", c.tmp), ValueError,
     ["no complete checkpoint-N", "--output_dir"]),
    ("resume/missing-folder", lambda c: resolve_resume_checkpoint(str(c.tmp / "gone"), c.tmp), ValueError,
     ["--resume_from_checkpoint", "no such folder"]),
    ("resume/incomplete", lambda c: resolve_resume_checkpoint(str(c.partial_checkpoint), c.tmp), ValueError,
     ["incomplete", "trainer_state.json"]),
    # ---- scripts/train.py
    ("train/nothing-to-do", script(*TRAIN), ValueError, ["Nothing to do", "--do_train"]),
    ("train/eval-without-generate", script(*TRAIN, "--do_eval", "--model_name_or_path", "{model_dir}"), ValueError,
     ["Nothing to do", "--predict_with_generate"]),
    ("train/score-untrained", script(*TRAIN, "--do_predict", "--predict_with_generate"), ValueError,
     ["randomly initialised", "--model_name_or_path"]),
    ("train/max_steps-0", script(*TRAIN, "--do_train", "--max_steps", "0"), ValueError,
     ["--max_steps 0 trains nothing", "--max_steps N > 0"]),
    ("train/epochs-0", script(*TRAIN, "--do_train", "--num_train_epochs", "0"), ValueError,
     ["--num_train_epochs 0.0 trains nothing"]),
    ("train/fp16-and-bf16", script(*TRAIN, "--do_train", "--fp16", "--bf16"), ValueError,
     ["--fp16 and --bf16", "pass one"]),
    ("train/bf16-without-gpu", lambda c: check_precision_flags(["--bf16"], has_gpu=False), ValueError,
     ["--bf16", "--use_cpu"]),
    ("train/config-typo", script(*TRAIN, "--do_train", "--config_overrides", "dropuot=0.3"), ValueError,
     ["'dropuot'", "'dropout'"]),
    ("train/tsv-extra-field", script(*TRAIN[:-1], "{extra_field_tsv}", "--do_train", "--max_steps", "1"), ValueError,
     ["extra_field.tsv:3", "tab-separated"]),
    ("train/no-tokenizer", command("train", "--output_dir", "{tmp}/run", "--do_train", "--use_cpu"),
     ValueError, ["no tokenizer", "--tokenizer_name"]),
    ("train/lr-schedule", script(*TRAIN, "--do_train", "--lr_schedule", "cosine", "--max_steps", "1"), ValueError,
     ["--lr_schedule must be"]),
    ("train/resume-missing", script(*TRAIN, "--do_train", "--resume_from_checkpoint", "{tmp}/gone"), ValueError,
     ["--resume_from_checkpoint", "no such folder"]),
    ("train/finetune-size-override",
     script(*TRAIN, "--do_train", "--max_steps", "1", "--model_name_or_path", "{model_dir}", "--config_overrides",
            "d_model=64"),
     ValueError, ["cannot change ['d_model']", "--preset"]),
    # ---- the other scripts
    ("train_tokenizer/vocab-too-small",
     command("train_tokenizer", "--train_file", "{data_dir}/train.tsv", "--vocab_size", "10", "--output_dir",
            "{tmp}/tok"),
     ValueError, ["vocab_size=10 is too small"]),
    ("evaluate/missing-model",
     command("evaluate", "--model", "{tmp}/none", "--test_file", "{data_dir}/test.tsv"),
     ValueError, ["--model", "no such folder"]),
    ("evaluate/missing-test-file",
     command("evaluate", "--model", "{model_dir}", "--test_file", "{tmp}/t.tsv"),
     FileNotFoundError, ["t.tsv"]),
    ("evaluate/damaged-weights",
     command("evaluate", "--model", "{damaged_dir}", "--test_file", "{data_dir}/test.tsv"),
     ValueError, ["model.safetensors", "damaged or incomplete"]),
    ("translate/missing-input", command("translate", "--model", "{model_dir}", "--input_file", "{tmp}/x"),
     ScriptExit, ["--input", "x does not exist"]),  # --input_file is the older spelling of --input
    ("translate/not-utf8-input",
     command("translate", "--model", "{model_dir}", "--input_file", "{latin1_tsv}"),
     ValueError, ["latin1.tsv:3", "not UTF-8"]),
    ("translate/batch-0",
     command("translate", "--model", "{model_dir}", "--input_file", "{sentences}", "--batch_size", "0"),
     ValueError, ["batch_size must be >= 1"]),
    ("average/no-checkpoints",
     command("average_checkpoints", "--run_dir", "{tmp}", "--output_dir", "{tmp}/a"),
     ValueError, ["0 complete checkpoints", "--num_checkpoints"]),
    ("average/count-0",
     command("average_checkpoints", "--run_dir", "{tmp}", "--output_dir", "{tmp}/a", "--num_checkpoints",
            "0"),
     ValueError, [">= 1, got 0"]),
    ("average/missing-run",
     command("average_checkpoints", "--run_dir", "{tmp}/x", "--output_dir", "{tmp}/a"),
     FileNotFoundError, ["training output folder", "not found", "vt-train"]),
    ("main_job/no-time", command("main_job", "--output_dir", "{tmp}/job", "--time_budget_minutes", "0"),
     ValueError, ["--time_budget_minutes 0", "no time"]),
    ("push_to_hub/missing-model",
     script(PUSH_TO_HUB, "--model", "{tmp}/none", "--repo_id", "u/m", "--dry_run", "{tmp}/hub"),
     ScriptExit, ["exit 2", "none"]),
    ("export/missing-model", script(EXPORT_ONNX, "--model", "{tmp}/none", "--output", "{tmp}/onnx"),
     ScriptExit, ["--model", "no such folder"]),
    ("export/not-a-model", script(EXPORT_ONNX, "--model", "{tmp}", "--output", "{tmp}/onnx"),
     ScriptExit, ["not a model folder", "config.json"]),
    ("export/int8-with-fp16",
     script(EXPORT_ONNX, "--model", "{model_dir}", "--output", "{tmp}/o", "--dtype", "fp16", "--quantize",
            "int8"),
     ScriptExit, ["int8", "fp16"]),
    ("export/unwritable-output", script(EXPORT_ONNX, "--model", "{model_dir}", "--output", "{a_file}/sub"),
     ScriptExit, ["error: cannot write", "a_file", "--output"]),
    ("export/damaged-weights", script(EXPORT_ONNX, "--model", "{damaged_dir}", "--output", "{tmp}/o"),
     ScriptExit, ["model.safetensors", "damaged or incomplete"]),
    ("export/bad-dtype", script(EXPORT_ONNX, "--model", "{model_dir}", "--output", "{tmp}/o", "--dtype",
                                "int4"), ScriptExit, ["--dtype", "invalid choice"]),  # fmt: skip
    ("ort_cli/missing-folder", ort_main("{tmp}/none", "a b"), ScriptExit, ["exit 2", "does not exist", "--model"]),
    ("ort_cli/missing-model-flag", ort_main("--model", "{tmp}/none", "a b"), ScriptExit, ["exit 2", "does not exist"]),
    ("ort_cli/not-an-export", ort_main("--model", "{tmp}", "a b"), ScriptExit, ["exit 2", "encoder_model.onnx"]),
    ("ort_cli/batch-0", ort_main("{export_dir}", "a b", "--batch-size", "0"), ScriptExit, ["--batch-size", ">= 1"]),
    ("ort_cli/batch_size-0", ort_main("--model", "{export_dir}", "a b", "--batch_size", "0"), ScriptExit,
     ["exit 2", "--batch_size", ">= 1"]),
    # ---- OrtTranslator
    ("ort/translate-None", lambda c: c.translator.translate(None), TypeError, ["list of strings", "NoneType"]),
    ("ort/translate-str", lambda c: c.translator.translate("a b"), ValueError, ["single str", "[text]"]),
    ("ort/translate-empty", lambda c: c.translator.translate([]), ValueError, ["texts is empty"]),
    ("ort/translate-non-str-item", lambda c: c.translator.translate(["a b", 3]), TypeError, ["texts[1]", "int"]),
    ("ort/num_beams-0", lambda c: c.translator.translate(["a b"], num_beams=0), ValueError, ["num_beams", ">= 1"]),
    ("ort/unknown-option", lambda c: c.translator.translate(["a b"], beams=2), ValueError,
     ["Unknown generation options", "num_beams"]),
    ("ort/ids-empty", lambda c: c.translator.generate(np.zeros((0, 3), np.int64)), ValueError, ["non-empty"]),
    ("ort/missing-folder", lambda c: OrtTranslator(c.tmp / "none"), ValueError, ["does not exist"]),
    ("ort/incomplete-folder", lambda c: OrtTranslator(c.model_dir), ValueError,
     ["encoder_model.onnx", "vt-export-onnx"]),
    ("ort/threads-0", lambda c: OrtTranslator(c.export_dir, intra_op_num_threads=0), ValueError,
     ["intra_op_num_threads"]),
    ("ort/provider", lambda c: OrtTranslator(c.export_dir, provider="tpu"), ValueError, ["Unknown provider 'tpu'"]),
]  # fmt: skip


@pytest.fixture(scope="module")
def shared(tmp_path_factory, toy_data_dir, toy_tokenizer_dir):
    """Files and objects every row may use; built once."""
    root = tmp_path_factory.mktemp("bad_inputs")
    model_dir = trained_model_dir()
    (root / "extra_field.tsv").write_text("en\tde\nThe file\tDie Datei\nOpen the file\tDatei\töffnen\n")
    (root / "extra_field.csv").write_text("en,de\nOpen the file,Datei,öffnen\n")
    (root / "latin1.tsv").write_bytes("en\tde\nHello\tHallo\nCafé\tCafé\n".encode("latin-1"))
    (root / "moses.en").write_text("a\nb\n")
    (root / "moses.de").write_bytes("a\n\xe9\n".encode("latin-1"))
    (root / "empty.tsv").write_text("")
    (root / "bad.jsonl").write_text('{"en": "a", "de": "b"}\n{"en": "a", \n')
    (root / "number.jsonl").write_text('{"en": 3, "de": "b"}\n')
    (root / "sentences.txt").write_text("a b c\n")
    (root / "a_file").write_text("not a folder\n")
    no_vocab = root / "no_vocab"
    no_vocab.mkdir()
    config = json.loads((model_dir / "config.json").read_text())
    del config["vocab_size"]
    (no_vocab / "config.json").write_text(json.dumps(config))
    damaged = root / "damaged"
    shutil.copytree(model_dir, damaged)
    (damaged / "model.safetensors").write_bytes(b"\x00" * 64)
    partial = root / "partial" / "checkpoint-8"
    partial.mkdir(parents=True)
    (partial / "model.safetensors").write_bytes(b"")
    return dict(
        model_dir=model_dir, export_dir=trained_export_dir(), tokenizer_dir=toy_tokenizer_dir, data_dir=toy_data_dir,
        extra_field_tsv=root / "extra_field.tsv", extra_field_csv=root / "extra_field.csv",
        latin1_tsv=root / "latin1.tsv", latin1_moses=root / "moses", empty_tsv=root / "empty.tsv",
        bad_jsonl=root / "bad.jsonl", number_jsonl=root / "number.jsonl", sentences=root / "sentences.txt",
        a_file=root / "a_file", no_vocab_dir=no_vocab, damaged_dir=damaged, partial_checkpoint=partial,
        model=load_trained_model(), translator=OrtTranslator(trained_export_dir(), provider="cpu"),
    )  # fmt: skip


@pytest.mark.parametrize(("call", "error", "words"), [pytest.param(*row[1:], id=row[0]) for row in ROWS])
def test_bad_input(call, error, words, shared, tmp_path):
    ctx = SimpleNamespace(**shared, tmp=tmp_path)
    with pytest.raises(error) as raised:
        call(ctx)
    message = str(raised.value)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
