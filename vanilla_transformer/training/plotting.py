"""Pictures of a training run: loss and BLEU curves, and one example's cross-attention (encoder-decoder attention,
paper §3.2.3) as a source × target heatmap, to see which source tokens each output token looked at."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers.utils import logging

logger = logging.get_logger(__name__)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    return plt


def _save(figure, path: str | os.PathLike) -> Path:
    """Lay out, write (creating the folder) and close a figure; returns its path."""
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    _pyplot().close(figure)
    return path


def plot_training_curves(log_history: list[dict], path: str | os.PathLike) -> Path:
    """Training loss, evaluation loss and evaluation BLEU/chrF against the optimizer step, as one PNG."""
    plt = _pyplot()
    series: dict[str, tuple[list[int], list[float]]] = {}
    for entry in log_history:
        for name in ("loss", "eval_loss", "eval_bleu", "eval_chrf"):
            if name in entry and "step" in entry:
                steps, values = series.setdefault(name, ([], []))
                steps.append(entry["step"])
                values.append(entry[name])
    figure, (loss_axis, bleu_axis) = plt.subplots(1, 2, figsize=(11, 4))
    for name in ("loss", "eval_loss"):
        if name in series:
            loss_axis.plot(*series[name], marker="." if name == "eval_loss" else None, label=name)
    loss_axis.set(xlabel="step", ylabel="loss (label-smoothed for training)", title="Loss")
    for name in ("eval_bleu", "eval_chrf"):
        if name in series:
            bleu_axis.plot(*series[name], marker="o", label=name)
    bleu_axis.set(xlabel="step", ylabel="score", title="Validation sacreBLEU / chrF")
    for axis in (loss_axis, bleu_axis):
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend()
    return _save(figure, path)


@torch.no_grad()
def cross_attention_matrix(model, tokenizer, source: str, max_new_tokens: int = 64) -> tuple:
    """Translate `source` greedily, then re-run the model on (source, translation) with eager attention.

    Returns:
        weights (target_len, source_len) averaged over the heads of the last decoder layer, the source tokens, the
        target tokens (the decoder inputs: `<s>` then the translation), and the translation text.
    """
    model.eval()
    device = next(model.parameters()).device
    encoded = tokenizer([source], return_tensors="pt").to(device)
    generated = model.generate(**encoded, num_beams=1, max_length=max_new_tokens + 1)
    decoder_input_ids = generated[:, :-1] if generated[0, -1] == tokenizer.eos_token_id else generated
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")  # attention weights are only returned by the eager path
    try:
        outputs = model(**encoded, decoder_input_ids=decoder_input_ids, output_attentions=True)
    finally:
        model.set_attn_implementation(previous)
    if not outputs.cross_attentions:
        raise ValueError("The model returned no cross-attentions; it must support output_attentions with eager.")
    weights = outputs.cross_attentions[-1][0].mean(dim=0).float().cpu()  # (heads, tgt, src) -> (tgt, src)
    source_tokens = [tokenizer.decode([i]) for i in encoded["input_ids"][0].tolist()]
    target_tokens = [tokenizer.decode([i]) for i in decoder_input_ids[0].tolist()]
    translation = tokenizer.decode(generated[0], skip_special_tokens=True)
    return weights, source_tokens, target_tokens, translation


def plot_cross_attention(model, tokenizer, source: str, path: str | os.PathLike) -> Path:
    """Heatmap of the last decoder layer's cross-attention for one example (rows: output tokens, columns: source)."""
    plt = _pyplot()
    weights, source_tokens, target_tokens, translation = cross_attention_matrix(model, tokenizer, source)
    height = max(3.0, 0.3 * len(target_tokens) + 1.5)
    width = max(4.0, 0.3 * len(source_tokens) + 2.0)
    figure, axis = plt.subplots(figsize=(width, height))
    image = axis.imshow(weights.numpy(), cmap="viridis", aspect="auto", vmin=0.0)
    axis.set_xticks(range(len(source_tokens)), [repr(t)[1:-1] for t in source_tokens], rotation=90, fontsize=8)
    axis.set_yticks(range(len(target_tokens)), [repr(t)[1:-1] for t in target_tokens], fontsize=8)
    axis.set(xlabel="source token", ylabel="decoder input token")
    axis.set_title(f"Cross-attention, last layer, head mean\n{source[:60]!r} → {translation[:60]!r}", fontsize=9)
    figure.colorbar(image, ax=axis, fraction=0.04)
    return _save(figure, path)
