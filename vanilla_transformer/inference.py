"""Batched beam-search translation (paper §6.1: beam 4, length penalty 0.6) and test-set scoring."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedModel
from transformers.utils import logging

from vanilla_transformer_ort.batches import translate_by_length

from .training.metrics import corpus_scores

logger = logging.get_logger(__name__)


def load_model_folder(path: str | os.PathLike, **kwargs) -> PreTrainedModel:
    """`AutoModelForSeq2SeqLM.from_pretrained(path)`, with unreadable weights reported with the file's name
    (safetensors' own errors name none)."""
    import vanilla_transformer  # noqa: F401  (registers the Auto classes)

    try:
        return AutoModelForSeq2SeqLM.from_pretrained(path, **kwargs)
    except Exception as error:
        if type(error).__name__ != "SafetensorError":
            raise
        files = sorted(p.name for p in Path(path).glob("*.safetensors"))
        raise ValueError(
            f"Cannot read the weights in {path} ({', '.join(files) or 'no .safetensors file'}): {error}. The file is "
            "damaged or incomplete (an interrupted copy or save?); copy or save it again."
        ) from None


def load_translation_model(path: str | os.PathLike, device: str | None = None) -> tuple[PreTrainedModel, object]:
    """Model and tokenizer from a folder written by scripts/train.py (or vt-average-checkpoints)."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"Model folder not found: {path}. Pass the --output_dir of a training run.")
    model = load_model_folder(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return model.to(device).eval(), tokenizer


@torch.no_grad()
def translate(
    model: PreTrainedModel,
    tokenizer,
    sentences: Sequence[str],
    batch_size: int = 32,
    num_beams: int | None = None,
    length_penalty: float | None = None,
    max_length: int | None = None,
    show_progress: bool = True,
) -> list[str]:
    """Translate `sentences` in batches (sorted by length to limit padding; returned in the input order); a blank
    sentence gives "" without reaching the model.

    Beam size, length penalty and maximum length default to the model's `generation_config`.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 (got {batch_size}).")
    model.eval()
    device = next(model.parameters()).device
    kwargs = {"num_beams": num_beams, "length_penalty": length_penalty, "max_length": max_length}
    kwargs = {name: value for name, value in kwargs.items() if value is not None}

    def translate_batch(batch: list[str]) -> list[str]:
        encoded = tokenizer(batch, return_tensors="pt", padding=True).to(device)
        generated = model.generate(**encoded, **kwargs)
        return [text.strip() for text in tokenizer.batch_decode(generated, skip_special_tokens=True)]

    def progress(batches: list[list[int]]):
        return tqdm(batches, desc="Translating", unit="batch", disable=not show_progress or len(batches) < 2)

    return translate_by_length(translate_batch, list(sentences), batch_size, progress)


def load_batch_translator(
    path: str | os.PathLike, num_beams: int | None = None, threads: int = 1, device: str | None = None
):
    """`translate_batch(texts) -> translations` over a trained model folder: the PyTorch backend the runtime's
    commands (`vt-translate-po --model FOLDER`) find under the `vanilla_transformer_ort.backends` entry point."""
    from vanilla_transformer_ort.cli_common import debug_requested

    from .progress import weight_progress_bars

    torch.set_num_threads(threads)
    with weight_progress_bars(debug_requested()):  # the weight bar only with the command's --debug
        model, tokenizer = load_translation_model(path, device=device)
    return lambda batch: translate(
        model, tokenizer, list(batch), batch_size=max(len(batch), 1), num_beams=num_beams, show_progress=False
    )


def evaluate_translations(
    model: PreTrainedModel, tokenizer, sources: Sequence[str], references: Sequence[str], **translate_kwargs
) -> tuple[dict[str, float], list[str]]:
    """sacreBLEU and chrF of the model's translations of `sources`, and the translations."""
    hypotheses = translate(model, tokenizer, sources, **translate_kwargs)
    return corpus_scores(hypotheses, references), hypotheses
