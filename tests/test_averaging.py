"""Checkpoint averaging equals the element-wise mean of the weights (numpy oracle) and gives a loadable model."""

import numpy as np
import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from tests.training_fixtures import *  # noqa: F403 (pytest fixtures)
from tests.training_fixtures import tiny_model
from vanilla_transformer.training.averaging import average_checkpoints, last_checkpoints


@pytest.fixture
def run_dir(tmp_path, toy_tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(toy_tokenizer_dir)
    for seed, step in enumerate((5, 10, 20, 100)):  # numeric order differs from string order (100 < 20 as text)
        path = tmp_path / f"checkpoint-{step}"
        tiny_model(tokenizer, seed=seed).save_pretrained(path)
        tokenizer.save_pretrained(path)
        (path / "trainer_state.json").write_text("{}")  # the Trainer writes it last: the checkpoint is complete
    (tmp_path / "checkpoint-notanumber").mkdir()
    return tmp_path


def test_last_checkpoints_in_step_order(run_dir):
    assert [p.name for p in last_checkpoints(run_dir, 3)] == ["checkpoint-10", "checkpoint-20", "checkpoint-100"]
    with pytest.raises(ValueError, match="has 4 complete checkpoints, fewer than the 5 requested"):
        last_checkpoints(run_dir, 5)
    with pytest.raises(FileNotFoundError, match="not found"):
        last_checkpoints(run_dir / "nope", 1)


def test_incomplete_checkpoints_are_not_averaged(run_dir, tmp_path, caplog):
    (run_dir / "checkpoint-200").mkdir()  # a save cut short: no weights, no trainer state
    (run_dir / "checkpoint-150").mkdir()
    (run_dir / "checkpoint-150" / "model.safetensors").write_bytes(b"")  # weights written, trainer state not
    assert [p.name for p in last_checkpoints(run_dir, 2)] == ["checkpoint-20", "checkpoint-100"]
    assert "Skipping incomplete checkpoint" in caplog.text and "checkpoint-200" in caplog.text


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


def test_final_weights_averaged_with_earlier_checkpoints(run_dir, toy_tokenizer_dir):
    from safetensors.torch import load_file

    from vanilla_transformer.training.averaging import average_with_checkpoints

    tokenizer = AutoTokenizer.from_pretrained(toy_tokenizer_dir)
    model = tiny_model(tokenizer, seed=7)
    final = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    # At step 20: the in-memory weights and the two newest earlier checkpoints (5 and 10); 20 and 100 are not earlier.
    names = average_with_checkpoints(model, run_dir, count=3, step=20)
    assert names == ["checkpoint-5", "checkpoint-10", "step 20"]
    saved = [load_file(str(run_dir / f"checkpoint-{step}" / "model.safetensors")) for step in (5, 10)]
    for name in saved[0]:
        expected = (saved[0][name].double() + saved[1][name].double() + final[name].double()) / 3
        np.testing.assert_allclose(model.state_dict()[name].double().numpy(), expected.numpy(), rtol=0, atol=1e-6)
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def test_final_weights_with_too_few_checkpoints(run_dir, toy_tokenizer_dir, caplog):
    from vanilla_transformer.training.averaging import average_with_checkpoints

    model = tiny_model(AutoTokenizer.from_pretrained(toy_tokenizer_dir), seed=7)
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    assert average_with_checkpoints(model, run_dir, count=5, step=5) == ["step 5"]  # nothing earlier than step 5
    assert all(torch.equal(before[name], tensor) for name, tensor in model.state_dict().items())
    assert average_with_checkpoints(model, run_dir, count=5, step=20) == ["checkpoint-5", "checkpoint-10", "step 20"]
    with pytest.raises(ValueError, match="at least 2"):
        average_with_checkpoints(model, run_dir, count=1, step=20)
