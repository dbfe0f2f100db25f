"""A translation does not depend on its batch: each source translated alone (the oracle) equals the same source
translated in shuffled batches, as a server's batches mix unrelated requests. fp32 graphs compute each row from that
row alone, and so do int8 graphs with one activation scale per row (the default); finished sentences leave the batch
or stay in it to its end, with the same outputs."""

import random

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from tests.onnx_helpers import WORDS, trained_export_dir, trained_int8_export_dir  # noqa: E402
from vanilla_transformer_ort import OrtTranslator  # noqa: E402
from vanilla_transformer_ort.decoder_state import InPlaceState, NumpyState  # noqa: E402

BATCH_SIZE = 8


def sources(count: int, seed: int = 0) -> list[str]:
    """Sentences of 1 to 9 words of the tiny model's vocabulary: outputs of varied lengths, so rows finish apart."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 9))) for _ in range(count)]


def alone_and_batched(translator: OrtTranslator, texts: list[str], **options) -> tuple[list[str], list[str]]:
    """Each text translated on its own, and the same texts in shuffled batches of BATCH_SIZE (put back in order)."""
    alone = [translator.translate([text], **options)[0] for text in texts]
    order = list(range(len(texts)))
    random.Random(0).shuffle(order)
    batched = [""] * len(texts)
    for start in range(0, len(order), BATCH_SIZE):
        indices = order[start : start + BATCH_SIZE]
        for index, output in zip(indices, translator.translate([texts[i] for i in indices], **options), strict=True):
            batched[index] = output
    return alone, batched


@pytest.mark.slow
@pytest.mark.parametrize("pruning", [True, False], ids=["pruning", "no pruning"])
@pytest.mark.parametrize("decoder_cache", ["inplace", "copy"])
@pytest.mark.parametrize("export", ["fp32", "int8 per row"])
@pytest.mark.parametrize("num_beams", [1, 4])
def test_a_translation_does_not_depend_on_its_batch(export, decoder_cache, pruning, num_beams, monkeypatch):
    if not pruning:  # the searches then decode every row to the batch's end
        monkeypatch.setattr(NumpyState, "keep_rows", None)
        monkeypatch.setattr(InPlaceState, "keep_rows", None)
    folder = trained_export_dir() if export == "fp32" else trained_int8_export_dir()
    translator = OrtTranslator(folder, provider="cpu", intra_op_num_threads=1, decoder_cache=decoder_cache)
    texts = sources(40)
    alone, batched = alone_and_batched(translator, texts, num_beams=num_beams, max_new_tokens=12)
    assert len({len(output.split()) for output in alone}) > 2  # rows of a batch finish at different steps
    differ = [(text, a, b) for text, a, b in zip(texts, alone, batched, strict=True) if a != b]
    assert not differ, f"{len(differ)} of {len(texts)} differ (text, alone, batched): {differ[:3]}"
