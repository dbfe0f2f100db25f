"""Translation quality: corpus sacreBLEU and chrF (paper §6.1 reports BLEU).

Computed with the `sacrebleu` package directly (`corpus_bleu` / `corpus_chrf`, default 13a tokenisation). This is the
same computation `evaluate.load("sacrebleu")` wraps, without its download of the metric script from the Hub.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """sacreBLEU and chrF of detokenised hypotheses against one reference each (both on a 0–100 scale)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"Got {len(hypotheses)} hypotheses for {len(references)} references; they must pair up.")
    if not hypotheses:
        raise ValueError("Cannot score an empty test set.")
    import sacrebleu  # here: `--help` of the training commands works without the train extra

    hypotheses, references = list(hypotheses), [list(references)]
    return {
        "bleu": sacrebleu.corpus_bleu(hypotheses, references).score,
        "chrf": sacrebleu.corpus_chrf(hypotheses, references).score,
    }


def decode_ids(ids: np.ndarray | Sequence[Sequence[int]], tokenizer) -> list[str]:
    """Decode generated ids or labels; -100 (label padding and the Trainer's cross-batch padding) becomes `<pad>`."""
    ids = np.asarray(ids)
    ids = np.where(ids < 0, tokenizer.pad_token_id, ids)
    return [text.strip() for text in tokenizer.batch_decode(ids, skip_special_tokens=True)]


def generated_lengths(
    ids: np.ndarray | Sequence[Sequence[int]], eos_token_id: int, special_ids: Sequence[int]
) -> np.ndarray:
    """Tokens each generated row holds before its first end-of-sentence token, special tokens not counted.

    Beam search fills a finished row up to the batch's longest with `</s>` (not `<pad>`), and the Trainer pads across
    batches with -100; counting every token that is not `<pad>` would count that filler too.
    """
    ids = np.asarray(ids)
    ended = np.cumsum(ids == eos_token_id, axis=1) > 0  # (rows, length): at or after the first </s>
    content = (ids >= 0) & ~np.isin(ids, list(special_ids)) & ~ended
    return content.sum(axis=1)


def build_compute_metrics(tokenizer) -> Callable:
    """`compute_metrics` for `Seq2SeqTrainer(predict_with_generate=True)`: BLEU, chrF and mean generated length."""

    def compute_metrics(eval_prediction) -> dict[str, float]:
        predictions, labels = eval_prediction.predictions, eval_prediction.label_ids
        if isinstance(predictions, tuple):
            predictions = predictions[0]
        scores = corpus_scores(decode_ids(predictions, tokenizer), decode_ids(labels, tokenizer))
        lengths = generated_lengths(predictions, tokenizer.eos_token_id, tokenizer.all_special_ids)
        scores["gen_len"] = float(np.mean(lengths))
        return {name: round(value, 4) for name, value in scores.items()}

    return compute_metrics
