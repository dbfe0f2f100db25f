"""Checkpoint averaging equals the element-wise mean of the weights (numpy oracle) and gives a loadable model."""

import numpy as np
import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from tests.training_fixtures import *  # noqa: F403 (pytest fixtures)
from tests.training_fixtures import tiny_model
from vanilla_transformer.averaging import average_checkpoints, last_checkpoints


@pytest.fixture
def run_dir(tmp_path, toy_tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(toy_tokenizer_dir)
    for seed, step in enumerate((5, 10, 20, 100)):  # numeric order differs from string order (100 < 20 as text)
        path = tmp_path / f"checkpoint-{step}"
        tiny_model(tokenizer, seed=seed).save_pretrained(path)
        tokenizer.save_pretrained(path)
    (tmp_path / "checkpoint-notanumber").mkdir()
    return tmp_path


def test_last_checkpoints_in_step_order(run_dir):
    assert [p.name for p in last_checkpoints(run_dir, 3)] == ["checkpoint-10", "checkpoint-20", "checkpoint-100"]
    with pytest.raises(ValueError, match="has 4 checkpoints, fewer than the 5 requested"):
        last_checkpoints(run_dir, 5)
    with pytest.raises(FileNotFoundError, match="not found"):
        last_checkpoints(run_dir / "nope", 1)


def test_average_equals_numpy_mean_and_loads(run_dir, tmp_path):
    checkpoints = last_checkpoints(run_dir, 3)
    output = average_checkpoints(checkpoints, tmp_path / "averaged")
    models = [AutoModelForSeq2SeqLM.from_pretrained(c) for c in checkpoints]
    averaged = AutoModelForSeq2SeqLM.from_pretrained(output)
    states = [m.state_dict() for m in models]
    for name, tensor in averaged.state_dict().items():
        expected = np.mean([s[name].double().numpy() for s in states], axis=0)
        np.testing.assert_allclose(tensor.double().numpy(), expected, rtol=1e-6, atol=1e-7, err_msg=name)
    # tying survived: one matrix for both embeddings and the output projection
    assert averaged.get_output_embeddings().weight.data_ptr() == averaged.get_input_embeddings().weight.data_ptr()
    assert not torch.equal(averaged.state_dict()["model.shared.weight"], states[-1]["model.shared.weight"])
    assert AutoTokenizer.from_pretrained(output).pad_token_id == 0


def test_average_rejects_mismatched_checkpoints(run_dir, tmp_path, toy_tokenizer_dir):
    from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

    other = VanillaTransformerConfig.from_preset(
        "tiny", vocab_size=len(AutoTokenizer.from_pretrained(toy_tokenizer_dir))
    )
    VanillaTransformerForConditionalGeneration(other).save_pretrained(tmp_path / "other")
    with pytest.raises(ValueError, match="not one model"):
        average_checkpoints([run_dir / "checkpoint-5", tmp_path / "other"], tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        average_checkpoints([run_dir / "checkpoint-notanumber"], tmp_path / "out")
