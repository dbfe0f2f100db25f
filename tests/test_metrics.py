"""BLEU and chrF equal sacreBLEU's own, and the mean generated length counts what the model wrote."""

import numpy as np
import pytest
import sacrebleu
from transformers import AutoTokenizer
from transformers.trainer_utils import EvalPrediction

from tests.training_fixtures import *  # noqa: F403 (pytest fixtures)
from vanilla_transformer.training.metrics import build_compute_metrics, corpus_scores, generated_lengths


def test_corpus_scores_equal_sacrebleu():
    hypotheses = ["Die Datei wurde nicht gefunden.", "Zugriff verweigert", "Möchten Sie fortfahren?"]
    references = ["Datei nicht gefunden.", "Zugriff verweigert", "Wollen Sie fortfahren?"]
    scores = corpus_scores(hypotheses, references)
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [references]).score)
    with pytest.raises(ValueError, match="must pair up"):
        corpus_scores(hypotheses, references[:2])


def test_generated_lengths_stop_at_the_first_end_of_sentence():
    # <s>=1 starts each row, </s>=2 ends it; beam search fills finished rows with </s>, the Trainer pads with -100.
    ids = np.array([[1, 7, 8, 2, 2, 2, -100], [1, 7, 8, 9, 10, 11, 2], [1, 2, 0, 0, -100, -100, -100]])
    assert generated_lengths(ids, eos_token_id=2, special_ids=[0, 1, 2]).tolist() == [2, 5, 0]
    # A row cut off at the maximum length, with no </s>, counts all its tokens.
    assert generated_lengths(np.array([[1, 5, 5, 5]]), eos_token_id=2, special_ids=[0, 1, 2]).tolist() == [3]


def test_compute_metrics_on_beam_search_output(toy_tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(toy_tokenizer_dir)
    texts = ["the red house.", "the key."]
    encoded = [tokenizer(text).input_ids for text in texts]  # each ends with </s>
    width = max(map(len, encoded)) + 3
    start, eos = tokenizer.convert_tokens_to_ids("<s>"), tokenizer.eos_token_id
    predictions = np.array([[start, *row] + [eos] * (width - len(row)) for row in encoded])  # filled with </s>
    labels = np.array([row + [-100] * (width + 1 - len(row)) for row in encoded])
    metrics = build_compute_metrics(tokenizer)(EvalPrediction(predictions=predictions, label_ids=labels))
    assert metrics["bleu"] == pytest.approx(100.0) and metrics["chrf"] == pytest.approx(100.0)
    assert metrics["gen_len"] == pytest.approx(np.mean([len(row) - 1 for row in encoded]))  # without </s>
