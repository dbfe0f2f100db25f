"""Texts through a model in batches of like length, answers in input order; a blank text never reaches the model.

Standard library only: the ONNX runtime (`bulk.py`, `protected_translation.py`, `bulk_ray.py`) and the PyTorch
helpers (`vanilla_transformer.inference`) batch with these two functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence


def is_blank(text: str) -> bool:
    """Empty or only white space: nothing to translate, and its translation is ""."""
    return not text.strip()


def length_batches(texts: Sequence[str], batch_size: int | None = None) -> list[list[int]]:
    """Indices of the non-blank `texts`, sorted by length (characters, a stand-in for tokens) and cut into batches
    of at most `batch_size` (None: one batch): sentences of like length share a batch, so little of it is padding."""
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = sorted((index for index, text in enumerate(texts) if not is_blank(text)), key=lambda i: len(texts[i]))
    size = batch_size or max(len(order), 1)
    return [order[start : start + size] for start in range(0, len(order), size)]


def translate_by_length(
    translate_batch: Callable[[list[str]], Sequence[str]],
    texts: Sequence[str],
    batch_size: int | None = None,
    progress: Callable[[list[list[int]]], Iterable[list[int]]] | None = None,
) -> list[str]:
    """`translate_batch` over `texts` in `length_batches`, the answers in the input order; a blank text gives "".

    Args:
        translate_batch: list of texts -> one translation per text, in order.
        texts: the texts to translate.
        batch_size: texts per `translate_batch` call (None: all at once).
        progress: wraps the list of batches for iteration (e.g. a tqdm bar over them).
    Returns:
        one translation per text.
    """
    translations = [""] * len(texts)
    batches = length_batches(texts, batch_size)
    for indices in progress(batches) if progress else batches:
        answer = list(translate_batch([texts[index] for index in indices]))
        if len(answer) != len(indices):
            raise ValueError(f"translate_batch returned {len(answer)} translations for {len(indices)} texts")
        for index, text in zip(indices, answer, strict=True):
            translations[index] = text
    return translations
