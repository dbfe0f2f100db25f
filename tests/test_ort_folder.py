"""The export folder read once (`vanilla_transformer_ort.folder.ExportFolder`) and the one length-sorted batching
(`vanilla_transformer_ort.batches`): what every runtime entry point takes, and the one-line errors a bad folder gets
wherever it is passed."""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("onnxruntime")

from tests.onnx_helpers import trained_export_dir  # noqa: E402
from vanilla_transformer_ort import ExportFolder, OrtTranslator  # noqa: E402
from vanilla_transformer_ort.batches import length_batches, translate_by_length  # noqa: E402
from vanilla_transformer_ort.bulk import translate_lines  # noqa: E402
from vanilla_transformer_ort.contract import (  # noqa: E402
    CONFIG_FILE,
    GENERATION_CONFIG_FILE,
    INPLACE_DECODER_FILE,
    MANIFEST_FILE,
    TOKENIZER_FILE,
)
from vanilla_transformer_ort.serve.models import parse_model_spec  # noqa: E402


@pytest.fixture
def folder(tmp_path):
    """A copy of the trained fp32 export, free to damage."""
    return shutil.copytree(trained_export_dir(), tmp_path / "export")


def test_the_folder_is_read_as_its_files_say(folder):
    export = ExportFolder(folder)
    assert export.manifest == json.loads((folder / MANIFEST_FILE).read_text())
    assert export.config == json.loads((folder / CONFIG_FILE).read_text())
    generation = json.loads((folder / GENERATION_CONFIG_FILE).read_text())
    assert export.settings.decoder_start_token_id == generation.get(
        "decoder_start_token_id", export.config["decoder_start_token_id"]
    )
    assert export.has(INPLACE_DECODER_FILE)
    assert ExportFolder.of(export) is export
    assert OrtTranslator(export, provider="cpu").export_folder is export  # taken as it is, not read again


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda f: shutil.rmtree(f), "does not exist"),
        (lambda f: (f / MANIFEST_FILE).unlink(), f"has no {MANIFEST_FILE}"),
        (lambda f: (f / TOKENIZER_FILE).unlink(), f"has no {TOKENIZER_FILE}"),
        (lambda f: (f / CONFIG_FILE).write_text("{not json"), "is not valid JSON"),
        (lambda f: (f / MANIFEST_FILE).write_text("[1, 2]"), "holds a JSON list, not an object"),
        (
            lambda f: (f / GENERATION_CONFIG_FILE).write_text(json.dumps({"do_sample": True})),
            "do_sample=True, which this runtime does not do",
        ),
    ],
    ids=["missing", "no manifest", "no tokenizer", "bad config", "manifest not an object", "sampling"],
)
def test_a_bad_folder_gets_the_same_one_line_error_everywhere(folder, damage, message):
    """The translator, bulk translation and the server's model spec all refuse it through `ExportFolder`."""
    damage(folder)
    for use in (
        lambda: ExportFolder(folder),
        lambda: OrtTranslator(folder, provider="cpu"),
        lambda: list(translate_lines(["a"], folder, workers=2)),
        lambda: parse_model_spec(f"en-de={folder}"),
    ):
        with pytest.raises(ValueError) as error:
            use()
        assert message in str(error.value) and "\n" not in str(error.value)


def test_length_batches_sort_by_length_and_skip_blank_texts():
    texts = ["ccc", "", "a", "   ", "bb", "dddd"]
    assert length_batches(texts, 2) == [[2, 4], [0, 5]]
    assert length_batches(texts) == [[2, 4, 0, 5]]
    assert length_batches(["", " "]) == []
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        length_batches(texts, 0)


def test_translate_by_length_answers_in_input_order():
    calls = []

    def upper(batch):
        calls.append(list(batch))
        return [text.upper() for text in batch]

    texts = ["three", "", "a", "twenty two", "b"]
    assert translate_by_length(upper, texts, 2) == ["THREE", "", "A", "TWENTY TWO", "B"]
    assert calls == [["a", "b"], ["three", "twenty two"]]  # blank texts never reach the model
    with pytest.raises(ValueError, match="returned 1 translations for 2 texts"):
        translate_by_length(lambda batch: batch[:1], texts, 2)
