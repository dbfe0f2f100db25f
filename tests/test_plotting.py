"""Training curves and the cross-attention heatmap are drawn; the attention rows are distributions."""

import torch
from transformers import AutoTokenizer

from tests.training_fixtures import *  # noqa: F403 (pytest fixtures)
from tests.training_fixtures import tiny_model
from vanilla_transformer.training.plotting import cross_attention_matrix, plot_cross_attention, plot_training_curves


def test_training_curves_png(tmp_path):
    history = [{"loss": 5.0 - i / 10, "step": i} for i in range(1, 20)] + [
        {"eval_loss": 4.0, "eval_bleu": 3.0, "eval_chrf": 20.0, "step": 10},
        {"eval_loss": 3.5, "eval_bleu": 6.0, "eval_chrf": 25.0, "step": 19},
    ]
    path = plot_training_curves(history, tmp_path / "curves.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_cross_attention_heatmap(tmp_path, toy_tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(toy_tokenizer_dir)
    model = tiny_model(tokenizer)
    source = "the red house is open."
    weights, source_tokens, target_tokens, _ = cross_attention_matrix(model, tokenizer, source, max_new_tokens=6)
    assert weights.shape == (len(target_tokens), len(source_tokens))
    assert "".join(source_tokens) == source + "</s>" and target_tokens[0] == "<s>"
    torch.testing.assert_close(weights.sum(dim=-1), torch.ones(len(target_tokens)), rtol=0, atol=1e-5)
    assert model.config._attn_implementation == "sdpa"  # switched back after the eager pass
    path = plot_cross_attention(model, tokenizer, source, tmp_path / "attention.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
