"""Step-level batching: submissions ("cohorts") whose sentences join a running decoder batch at different steps and
leave it as they finish get exactly what `OrtTranslator.generate` gives their sentences alone (the oracle: the
runtime's own request-level path, itself checked against transformers' `generate()` in test_ort_runtime.py)."""

import threading
import time

import numpy as np
import pytest

from tests.onnx_helpers import copying_model_dir
from vanilla_transformer.export.onnx.export import export_model
from vanilla_transformer_ort import step_batching
from vanilla_transformer_ort.step_batching import StepBatcher
from vanilla_transformer_ort.translator import OrtTranslator


@pytest.fixture(scope="module")
def translator(tmp_path_factory):
    folder = tmp_path_factory.mktemp("step") / "onnx"
    export_model(copying_model_dir(), folder)
    return OrtTranslator(folder, provider="cpu")


def _sources(count: int, seed: int, longest: int = 10) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(4, 37, rng.integers(1, longest))] + [2] for _ in range(count)]


def _padded(sources: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.zeros((len(sources), max(map(len, sources))), np.int64)
    mask = np.zeros_like(ids)
    for row, source in enumerate(sources):
        ids[row, : len(source)], mask[row, : len(source)] = source, 1
    return ids, mask


def _submit_staggered(batcher: StepBatcher, cohorts: list[list[list[int]]], threads: int = 3) -> list:
    """Submit the cohorts from several threads, a few milliseconds apart, so that they join a running batch."""
    results: list = [None] * len(cohorts)

    def client(start: int) -> None:
        for index in range(start, len(cohorts), threads):
            results[index] = batcher.submit(cohorts[index])
            time.sleep(0.004)

    workers = [threading.Thread(target=client, args=(start,)) for start in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return [future.result(timeout=120) for future in results]


@pytest.mark.parametrize("num_beams", [1, 4])
def test_cohorts_joining_a_running_batch_equal_generate(translator, num_beams):
    sources = _sources(60, seed=num_beams)
    cohorts = [sources[i : i + k] for i, k in zip(range(0, 60, 3), [1, 3, 2] * 7, strict=False)]
    options = {"num_beams": num_beams, "max_new_tokens": 14}
    batcher = StepBatcher(translator, max_sentences=8, **options)
    try:
        outputs = _submit_staggered(batcher, cohorts)
        stats = batcher.take_stats()
    finally:
        batcher.close()
    for cohort, output in zip(cohorts, outputs, strict=True):
        expected = translator.generate(*_padded(cohort), **options)
        assert np.array_equal(output, expected), cohort
    assert stats.rows / stats.steps > num_beams  # cohorts shared decoder steps


def test_buffers_grow_and_shrink_with_the_batch(translator, monkeypatch):
    """More sources than the buffers hold at first, sources and outputs longer than their capacities, joining short
    ones, and short ones after they left."""
    monkeypatch.setattr(step_batching, "INITIAL_SOURCE_CAPACITY", 4)
    monkeypatch.setattr(step_batching, "INITIAL_CACHE_CAPACITY", 3)
    monkeypatch.setattr(step_batching, "INITIAL_SLOTS", 1)
    long_ones = _sources(4, seed=7, longest=30)
    short_ones = _sources(12, seed=8, longest=3)
    cohorts = [long_ones[:2], short_ones[:4], long_ones[2:], short_ones[4:8], short_ones[8:]]
    options = {"num_beams": 2, "max_new_tokens": 20}
    batcher = StepBatcher(translator, max_sentences=6, **options)
    try:
        outputs = _submit_staggered(batcher, cohorts, threads=2)
    finally:
        batcher.close()
    for cohort, output in zip(cohorts, outputs, strict=True):
        assert np.array_equal(output, translator.generate(*_padded(cohort), **options))


def test_more_sources_than_slots_are_split_into_cohorts(translator):
    sources = _sources(19, seed=3)
    batcher = StepBatcher(translator, max_sentences=5, max_new_tokens=12)
    try:
        output = batcher.submit(sources).result(timeout=120)
    finally:
        batcher.close()
    expected = translator.generate(*_padded(sources), max_new_tokens=12)
    assert np.array_equal(output, expected)


def _joins_after_a_held_step(batcher: StepBatcher, monkeypatch, holding: list, then: list) -> list[list[int]]:
    """Submit `holding` (source lists) and let it take the places; hold the batch's first step while the `then`
    submissions, `(sources, first)`, queue; release it and finish. The sources in the order they joined."""
    joined, release = [], threading.Event()
    join, step = batcher._join, batcher._step
    monkeypatch.setattr(batcher, "_join", lambda sentences: (joined.extend(s[2] for s in sentences), join(sentences)))
    monkeypatch.setattr(batcher, "_step", lambda: (release.wait(30), step()))
    try:
        futures = [batcher.submit(holding)]
        time.sleep(0.2)  # `holding` joined and holds the places
        futures += [batcher.submit(sources, first=first) for sources, first in then]
        release.set()
        for future in futures:
            future.result(timeout=60)
    finally:
        release.set()
        batcher.close()
    return joined


def test_first_goes_before_the_waiting_sources(translator, monkeypatch):
    """`submit(..., first=True)` (the server's placeholder retries) joins before the sources waiting for a place."""
    batcher = StepBatcher(translator, max_sentences=1, max_new_tokens=6)
    joined = _joins_after_a_held_step(batcher, monkeypatch, [[5, 2]], [([[6, 2]], False), ([[7, 2], [8, 2]], True)])
    assert joined == [[5, 2], [7, 2], [8, 2], [6, 2]]


def test_waiting_submissions_take_turns(translator, monkeypatch):
    """A one-sentence submission that comes after a long one joins with the long one's first sentence, not after
    all of them."""
    batcher = StepBatcher(translator, max_sentences=2, max_new_tokens=6)
    long = [[5, 2], [5, 5, 2], [5, 5, 5, 2], [5, 5, 5, 5, 2]]
    joined = _joins_after_a_held_step(batcher, monkeypatch, [[4, 2], [4, 4, 2]], [(long, False), ([[6, 2]], False)])
    assert joined[:2] == [[4, 2], [4, 4, 2]]
    assert joined.index([6, 2]) < joined.index([5, 5, 2]), joined  # its turn came before the long one's second
    assert sorted(map(tuple, joined[2:])) == sorted(map(tuple, [*long, [6, 2]]))


def test_bad_input_and_folders_without_per_row_lengths(translator):
    copying = OrtTranslator(translator.folder, provider="cpu", decoder_cache="copy")
    with pytest.raises(ValueError, match="per-row lengths"):
        StepBatcher(copying)
    with pytest.raises(ValueError, match="max_sentences"):
        StepBatcher(translator, max_sentences=0)
    batcher = StepBatcher(translator)
    try:
        with pytest.raises(ValueError, match="at least one"):
            batcher.submit([])
        with pytest.raises(ValueError, match="Unknown generation options"):
            StepBatcher(translator, beams=3)
    finally:
        batcher.close()
    with pytest.raises(RuntimeError, match="closed"):
        batcher.submit([[5, 2]])


def test_a_fault_of_the_batch_fails_its_cohorts_instead_of_hanging(translator, monkeypatch):
    batcher = StepBatcher(translator, max_sentences=4, max_new_tokens=8)
    monkeypatch.setattr(batcher, "_decode", lambda rows, total: (_ for _ in ()).throw(MemoryError("no room")))
    running = batcher.submit(_sources(2, seed=1))
    with pytest.raises(RuntimeError, match="stopped: MemoryError"):
        running.result(timeout=30)
    with pytest.raises(RuntimeError, match="stopped: MemoryError"):
        batcher.submit([[5, 2]])
    batcher.close()
