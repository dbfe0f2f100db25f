"""The torch-free runtime: token-identical to `generate()` (greedy, beam 4) on a padded batch, text in / text out,
a process where torch cannot be imported, and clear errors for bad folders, providers and inputs."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from tests.onnx_helpers import (
    SENTENCES,
    build_tokenizer,
    load_trained_model,
    train_copy_model,
    trained_export_dir,
)
from vanilla_transformer_ort import OrtTranslator

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model():
    return load_trained_model()


@pytest.fixture(scope="module", params=["inplace", "copy"])
def translator(request) -> OrtTranslator:
    """Both decoders of an export folder: the in-place one (the default on CPU) and the copying one."""
    translator = OrtTranslator(trained_export_dir(), provider="cpu", decoder_cache=request.param)
    assert translator.inplace == (request.param == "inplace")
    return translator


@pytest.fixture(scope="module")
def batch():
    encoded = build_tokenizer()(SENTENCES, return_tensors="pt", padding=True)
    assert (encoded["attention_mask"] == 0).any()  # the batch is padded
    return encoded["input_ids"], encoded["attention_mask"]


def _generate(model, batch, **kwargs) -> np.ndarray:
    with torch.no_grad():
        return model.generate(input_ids=batch[0], attention_mask=batch[1], **kwargs).numpy()


def test_outputs_have_varied_lengths(model, batch):
    """Guards the comparisons below: rows finish at different steps, so EOS handling is exercised."""
    output = _generate(model, batch, max_new_tokens=15)
    lengths = {int((row == 2).argmax()) for row in output if (row == 2).any()}
    assert len(lengths) >= 3, output


@pytest.mark.parametrize(
    "options",
    [
        {"max_new_tokens": 3},
        {"max_new_tokens": 15},
        {"max_new_tokens": 6, "forced_eos_token_id": 2, "min_new_tokens": 2},
    ],
)
def test_greedy_is_token_identical_to_generate(model, translator, batch, options):
    expected = _generate(model, batch, **options)
    actual = translator.generate(batch[0].numpy(), batch[1].numpy(), **options)
    np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize(
    "options",
    [
        {"max_new_tokens": 15},
        {"max_new_tokens": 15, "length_penalty": 0.6, "early_stopping": True},
        {"max_new_tokens": 6, "length_penalty": 2.0, "early_stopping": "never"},
        {"max_new_tokens": 15, "length_penalty": -1.0, "min_new_tokens": 4},
        {"max_new_tokens": 5, "forced_eos_token_id": 2},
    ],
)
def test_beam4_is_token_identical_to_generate(model, translator, batch, options):
    expected = _generate(model, batch, num_beams=4, **options)
    actual = translator.generate(batch[0].numpy(), batch[1].numpy(), num_beams=4, **options)
    np.testing.assert_array_equal(actual, expected)


def test_search_helpers_match_transformers():
    """Top-k order and the min-length / forced-EOS processors against transformers' own implementations."""
    from transformers.generation.logits_process import ForcedEOSTokenLogitsProcessor, MinNewTokensLengthLogitsProcessor

    from vanilla_transformer_ort.ranking import top_k
    from vanilla_transformer_ort.search import GenerationSettings, process_scores

    scores = np.random.default_rng(0).standard_normal((3, 50)).astype(np.float32)
    values, indices = top_k(scores, 8)
    expected_values, expected_indices = torch.topk(torch.from_numpy(scores), 8)
    np.testing.assert_array_equal(values, expected_values.numpy())
    np.testing.assert_array_equal(indices, expected_indices.numpy())
    settings = GenerationSettings(decoder_start_token_id=1, eos_token_ids=[2], max_new_tokens=6, min_new_tokens=3)
    settings.forced_eos_token_id = 2
    min_new = MinNewTokensLengthLogitsProcessor(1, 3, 2)
    forced = ForcedEOSTokenLogitsProcessor(7, 2)
    for cur_len in range(1, 7):
        ids = torch.ones(3, cur_len, dtype=torch.long)
        expected = forced(ids, min_new(ids, torch.from_numpy(scores))).numpy()
        np.testing.assert_array_equal(process_scores(scores.copy(), cur_len, settings), expected)


def test_score_bias_is_process_scores_as_an_addition():
    """What `beam_scores.onnx` adds equals the processors, except at the forced-EOS step, which it leaves to numpy."""
    from vanilla_transformer_ort.search import GenerationSettings, process_scores, score_bias

    scores = np.random.default_rng(1).standard_normal((4, 30)).astype(np.float32)
    scores[0, 5] = -np.inf  # log_softmax can give -inf; -inf + bias stays -inf
    for forced in (None, 2):
        settings = GenerationSettings(
            decoder_start_token_id=1, eos_token_ids=[2, 9], max_new_tokens=6, min_new_tokens=3
        )
        settings.forced_eos_token_id = forced
        for cur_len in range(1, 7):
            bias = score_bias(cur_len, settings, 30)
            if forced is not None and cur_len == 6:
                assert bias is None
                continue
            np.testing.assert_array_equal(scores + bias, process_scores(scores.copy(), cur_len, settings))


class _HistoryState:
    """A decoder whose logits are a function of the sentence and its tokens so far (a seeded draw), so that a row's
    logits do not depend on the other rows: the rows are (sentence, history) pairs that a search reorders."""

    def __init__(self, vocab_size: int, ranks: bool):
        self.vocab_size, self.ranks_candidates = vocab_size, ranks
        self.rows: list[tuple[int, tuple[int, ...]]] = []

    def add(self, sentence: int, beams: int) -> None:
        self.rows += [(sentence, ())] * beams

    def step(self, last_tokens: np.ndarray) -> np.ndarray:
        self.rows = [(s, h + (int(t),)) for (s, h), t in zip(self.rows, last_tokens[:, 0], strict=True)]
        draws = [np.random.default_rng([s, *h]).normal(0, 3, self.vocab_size) for s, h in self.rows]
        return np.array(draws, dtype=np.float32)

    def step_top_k(self, last_tokens, running_scores, bias, batch_size, k):
        from vanilla_transformer_ort.ranking import log_softmax, top_k

        scores = log_softmax(self.step(last_tokens)) + bias + running_scores
        return top_k(scores.reshape(batch_size, -1), k)

    def reorder(self, rows: np.ndarray) -> None:
        self.rows = [self.rows[r] for r in rows.tolist()]

    def keep_rows(self, rows: np.ndarray) -> None:
        self.reorder(rows)


@pytest.mark.parametrize(("num_beams", "ranks"), [(1, False), (3, False), (3, True)])
@pytest.mark.parametrize(
    "options",
    [{}, {"min_new_tokens": 3, "length_penalty": 0.6}, {"early_stopping": "never", "length_penalty": 2.0},
     {"early_stopping": False, "forced_eos_token_id": 2}],
)  # fmt: skip
def test_sentences_joining_a_running_search_equal_each_searched_alone(num_beams, ranks, options):
    """Step-level batching's premise: sentences that join a search between its steps, while others are at other
    lengths (so that processors and length penalties differ by row), and leave it as they finish, get exactly what
    `greedy_search` / `beam_search` give each alone."""
    from vanilla_transformer_ort.search import BeamSearch, GenerationSettings, GreedySearch, beam_search, greedy_search

    settings = GenerationSettings(
        decoder_start_token_id=1, eos_token_ids=[2], pad_token_id=0, max_new_tokens=12, num_beams=num_beams,
        banned_token_ids=[0], **{"early_stopping": True, **options},
    )  # fmt: skip
    vocab = 9
    alone = greedy_search if num_beams == 1 else beam_search
    joins = {0: 2, 1: 1, 3: 3, 4: 1, 9: 2, 15: 1}  # step -> sentences joining before it
    search = GreedySearch(settings) if num_beams == 1 else BeamSearch(settings, vocab)
    state, members, outputs, step, lengths_seen = _HistoryState(vocab, ranks), [], {}, 0, set()
    while step <= max(joins) or search.size:
        for _ in range(joins.get(step, 0)):
            sentence = len(members) + len(outputs)
            state.add(sentence, num_beams)
            members.append(sentence)
            search.add(1)
        if search.size:
            lengths_seen.add(len(set(search.cur_lens.tolist())))
            search.step(state)
            done = search.done()
            for sentence, output in zip(np.array(members)[done].tolist(), search.remove(done), strict=True):
                outputs[sentence] = output
            members = [m for m, gone in zip(members, done.tolist(), strict=True) if not gone]
            state.keep_rows(search.rows(np.flatnonzero(~done)))
        step += 1
    assert max(lengths_seen) > 1  # sentences at different lengths shared steps
    assert len(outputs) == sum(joins.values())
    for sentence, output in outputs.items():
        expected = _HistoryState(vocab, ranks)
        expected.add(sentence, num_beams)
        np.testing.assert_array_equal(output, alone(expected, 1, settings)[0], err_msg=f"sentence {sentence}")


@pytest.mark.parametrize("length", [50, 7 * 256, 5000, 32000 * 4 + 17])
@pytest.mark.parametrize("k", [1, 8])
def test_top_k_matches_a_full_stable_sort(length, k):
    """The blocked search against sorting whole rows, with many ties (scores drawn from a few values)."""
    from vanilla_transformer_ort.ranking import top_k

    rng = np.random.default_rng(length + k)
    scores = rng.integers(-3, 4, (5, length)).astype(np.float32)
    scores[0] = rng.standard_normal(length)
    scores[1, -3:] = 9.0  # the largest values in the tail that fills no whole block
    scores[2] = -np.inf
    scores[2, length // 3] = 0.0
    values, indices = top_k(scores, k)
    order = np.lexsort((np.broadcast_to(np.arange(length), scores.shape), -scores), axis=1)[:, :k]
    np.testing.assert_array_equal(indices, order)
    np.testing.assert_array_equal(values, np.take_along_axis(scores, order, axis=1))


def test_beam4_with_the_two_stage_ranking_is_token_identical(batch, tmp_path):
    """A model of 40 tokens, whose `beam_scores.onnx` takes its top k from the best of 4 blocks of 10 candidates a
    row (`write_beam_scores_graph(block_size=10)`), decodes as `generate()` does with either decoder."""
    import onnx

    from vanilla_transformer.export.onnx.export import export_model
    from vanilla_transformer.export.onnx.helper_graphs import write_beam_scores_graph

    model = train_copy_model(vocab_size=40)
    model.save_pretrained(tmp_path / "model")
    build_tokenizer().save_pretrained(tmp_path / "model")
    folder = tmp_path / "export"
    export_model(tmp_path / "model", folder)
    write_beam_scores_graph(folder, block_size=10)
    assert "ReduceMax" in {n.op_type for n in onnx.load(str(folder / "beam_scores.onnx")).graph.node}
    for decoder_cache in ("inplace", "copy"):
        translator = OrtTranslator(folder, provider="cpu", decoder_cache=decoder_cache)
        for options in ({}, {"max_new_tokens": 5, "forced_eos_token_id": 2}, {"min_new_tokens": 4}):
            expected = _generate(model, batch, num_beams=4, **options)
            actual = translator.generate(batch[0].numpy(), batch[1].numpy(), num_beams=4, **options)
            np.testing.assert_array_equal(actual, expected)


def test_io_binding_path_is_token_identical(model, batch):
    """The path CUDA uses (cache kept in onnxruntime values; beam reordering and ranking by the helper graphs), run
    here on the CPU device."""
    bound = OrtTranslator(trained_export_dir(), provider="cpu", use_io_binding=True)
    for num_beams in (1, 4):
        expected = _generate(model, batch, num_beams=num_beams, max_new_tokens=15)
        actual = bound.generate(batch[0].numpy(), batch[1].numpy(), num_beams=num_beams, max_new_tokens=15)
        np.testing.assert_array_equal(actual, expected)


def test_defaults_come_from_generation_config(model, batch, tmp_path):
    folder = tmp_path / "export"
    shutil.copytree(trained_export_dir(), folder)
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**generation, "num_beams": 4, "max_length": 9}))
    expected = _generate(model, batch, num_beams=4, max_length=9)
    actual = OrtTranslator(folder, provider="cpu").generate(batch[0].numpy(), batch[1].numpy())
    np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_default_length_is_transformers_default(model, translator, batch, num_beams):
    """With neither max_length nor max_new_tokens set anywhere, `generate()` makes 20 new tokens at most, capped by the
    model's max_position_embeddings (12 here, so 11 after the start token); no EOS may end a row before that."""
    assert "max_length" not in json.loads((trained_export_dir() / "generation_config.json").read_text())
    expected = _generate(model, batch, num_beams=num_beams, min_new_tokens=11)
    actual = translator.generate(batch[0].numpy(), batch[1].numpy(), num_beams=num_beams, min_new_tokens=11)
    assert expected.shape[1] == 12
    np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize(
    ("generation", "max_position_embeddings", "max_new_tokens"),
    [({}, 12, 11), ({}, 1024, 20), ({}, None, 20), ({"max_length": 9}, 1024, 8), ({"max_new_tokens": 7}, 12, 7)],
)
def test_settings_resolve_the_length_as_transformers(tmp_path, generation, max_position_embeddings, max_new_tokens):
    from vanilla_transformer_ort import settings_from_folder

    config = {"decoder_start_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    if max_position_embeddings is not None:
        config["max_position_embeddings"] = max_position_embeddings
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    assert settings_from_folder(tmp_path).max_new_tokens == max_new_tokens


def test_translate_text_matches_pytorch(model, translator):
    tokenizer = build_tokenizer()
    encoded = tokenizer(SENTENCES, return_tensors="pt", padding=True)
    input_ids, attention_mask = translator.encode(SENTENCES)
    np.testing.assert_array_equal(input_ids, encoded["input_ids"].numpy())
    np.testing.assert_array_equal(attention_mask, encoded["attention_mask"].numpy())
    for num_beams in (1, 4):
        with torch.no_grad():
            output = model.generate(**encoded, num_beams=num_beams, max_new_tokens=15)
        expected = tokenizer.batch_decode(output, skip_special_tokens=True)
        assert translator.translate(SENTENCES, num_beams=num_beams, max_new_tokens=15) == expected


def test_runs_where_torch_cannot_be_imported(translator):
    """A deployment image has onnxruntime, numpy and tokenizers only."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from vanilla_transformer_ort import OrtTranslator\n"
        f"t = OrtTranslator({str(trained_export_dir())!r}, provider='cpu')\n"
        f"out = t.translate({SENTENCES!r}, num_beams=4, max_new_tokens=15)\n"
        "assert not any(m == 'torch' or m.startswith(('torch.', 'vanilla_transformer.', 'transformers'))"
        " for m, v in sys.modules.items() if v is not None)\n"
        "print(repr(out))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    expected = translator.translate(SENTENCES, num_beams=4, max_new_tokens=15)
    assert result.stdout.strip() == repr(expected)


def test_cli_translates_without_torch():
    argv = ["translate_onnx.py", str(trained_export_dir()), "a b c"]
    script = f"import sys, runpy; sys.modules['torch'] = None; sys.argv = {argv!r}"
    code = f"{script}; runpy.run_path({str(REPO / 'scripts/translate_onnx.py')!r}, run_name='__main__')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == OrtTranslator(trained_export_dir(), provider="cpu").translate(["a b c"])[0]


@pytest.mark.parametrize(
    "missing",
    ["encoder_model.onnx", "decoder_model.onnx", "cache_reorder.onnx", "beam_scores.onnx", "tokenizer.json",
     "encoder_model.onnx.data", "shared_embedding.bin"],
)  # fmt: skip
def test_folder_missing_a_file_names_it(tmp_path, missing):
    folder = tmp_path / "export"
    shutil.copytree(trained_export_dir(), folder)
    (folder / missing).unlink()
    with pytest.raises(ValueError, match=missing.replace(".", r"\.")):
        OrtTranslator(folder)
    with pytest.raises(ValueError, match="does not exist"):
        OrtTranslator(tmp_path / "nowhere")


def test_translators_of_a_folder_read_one_embedding_buffer(tmp_path, batch):
    """The shared table is loaded once per process and onnxruntime reads that buffer itself, not a copy: scaling it
    in place changes the encoder's output, and restoring it restores the output."""
    from vanilla_transformer_ort import sessions

    folder = tmp_path / "export"
    shutil.copytree(trained_export_dir(), folder)
    first, second = OrtTranslator(folder, provider="cpu"), OrtTranslator(folder, provider="cpu")
    value, names = sessions.shared_table(folder, first.manifest)
    assert value is sessions.shared_table(folder, second.manifest)[0] and names
    table = next(entry[1] for entry in sessions._SHARED_TABLES.values() if entry[0] is value)
    feed = {"input_ids": batch[0].numpy(), "attention_mask": batch[1].numpy()}
    before = second.encoder.run(["last_hidden_state"], feed)[0]
    table *= 2.0
    try:
        changed = second.encoder.run(["last_hidden_state"], feed)[0]
    finally:
        table /= 2.0
    assert not np.allclose(before, changed, atol=1e-3)
    np.testing.assert_array_equal(second.encoder.run(["last_hidden_state"], feed)[0], before)


def test_shared_table_of_the_wrong_size_is_refused(tmp_path):
    folder = tmp_path / "export"
    shutil.copytree(trained_export_dir(), folder)
    with open(folder / "shared_embedding.bin", "ab") as handle:
        handle.write(b"\0" * 8)
    with pytest.raises(ValueError, match="shared_embedding.bin holds .* bytes; manifest.json records"):
        OrtTranslator(folder, provider="cpu")


def test_bad_provider_names_the_problem():
    with pytest.raises(ValueError, match="Unknown provider 'tpu'"):
        OrtTranslator(trained_export_dir(), provider="tpu")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        with pytest.raises(ValueError, match="onnxruntime-gpu"):
            OrtTranslator(trained_export_dir(), provider="cuda")


def test_session_options_reach_onnxruntime(model, batch):
    from vanilla_transformer_ort.sessions import session_options

    options = session_options(2, config_entries={"session.intra_op.allow_spinning": "0"})
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    # threads stop spinning when a run ends, unless the caller says otherwise
    assert options.get_session_config_entry("session.force_spinning_stop") == "1"
    kept = session_options(2, config_entries={"session.force_spinning_stop": "0"})
    assert kept.get_session_config_entry("session.force_spinning_stop") == "0"
    assert not options.enable_cpu_mem_arena and session_options(1, enable_cpu_mem_arena=True).enable_cpu_mem_arena
    with pytest.raises(ValueError, match="intra_op_num_threads"):
        session_options(0)
    # the process's one CPU arena (the translator's default on CPU): sessions opt in to onnxruntime's env allocators
    shared = session_options(1, shared_cpu_arena=True)
    assert shared.enable_cpu_mem_arena and shared.get_session_config_entry("session.use_env_allocators") == "1"
    with pytest.raises(RuntimeError, match="use_env_allocators"):  # not set unless asked for
        options.get_session_config_entry("session.use_env_allocators")
    ids, mask = batch[0].numpy(), batch[1].numpy()
    expected = _generate(model, batch, num_beams=2, max_new_tokens=6)
    for arena in (True, False):  # each session's own arena, or none
        own = OrtTranslator(trained_export_dir(), provider="cpu", shared_cpu_arena=False, enable_cpu_mem_arena=arena)
        np.testing.assert_array_equal(own.generate(ids, mask, num_beams=2, max_new_tokens=6), expected)


def _optimized_ops(tmp_path: Path, disabled_optimizers) -> list:
    """The decoder graph as onnxruntime's CPU session optimizes it (written out with `optimized_model_filepath`)."""
    import onnx

    from vanilla_transformer_ort.contract import DECODER_FILE
    from vanilla_transformer_ort.sessions import create_session, session_options

    options = session_options(1)
    options.optimized_model_filepath = str(tmp_path / f"optimized-{len(disabled_optimizers or ())}.onnx")
    create_session(trained_export_dir() / DECODER_FILE, options, ["CPUExecutionProvider"], disabled_optimizers)
    return list(onnx.load(options.optimized_model_filepath, load_external_data=False).graph.node)  # nodes only


def _scale(node) -> float:
    return next((a.f for a in node.attribute if a.name == "alpha"), 1.0)


def test_cpu_sessions_skip_the_slower_fusions(tmp_path, model, batch):
    """By default the CPU decoder keeps residual Add + LayerNormalization and the attention scale as its own Mul."""
    nodes = _optimized_ops(tmp_path, None)
    ops = {node.op_type for node in nodes}
    assert "SkipLayerNormalization" not in ops and "LayerNormalization" in ops
    fused = [node for node in nodes if node.op_type == "FusedMatMul"]  # Q K^T, the transpose still folded in
    assert fused and all(_scale(node) == 1.0 for node in fused)
    # The same check against the fully fused graph: both fusions apply to this model, so the check above can fail.
    all_fused = _optimized_ops(tmp_path, ())
    assert "SkipLayerNormalization" in {node.op_type for node in all_fused}
    assert any(_scale(node) != 1.0 for node in all_fused if node.op_type == "FusedMatMul")
    with pytest.raises(ValueError, match="sequence of fusion names"):
        OrtTranslator(trained_export_dir(), provider="cpu", disabled_optimizers="SkipLayerNormFusion")
    # Both ways stay token-identical to generate().
    fully_fused = OrtTranslator(trained_export_dir(), provider="cpu", disabled_optimizers=())
    expected = _generate(model, batch, num_beams=2, max_new_tokens=6)
    np.testing.assert_array_equal(
        fully_fused.generate(batch[0].numpy(), batch[1].numpy(), num_beams=2, max_new_tokens=6), expected
    )


def test_bad_inputs_name_the_problem(translator, batch):
    ids, mask = batch[0].numpy(), batch[1].numpy()
    with pytest.raises(ValueError, match="input_ids must be an integer array, got dtype float32"):
        translator.generate(ids.astype(np.float32), mask)
    with pytest.raises(ValueError, match="input_ids must have rank 2"):
        translator.generate(ids[0], mask[0])
    with pytest.raises(ValueError, match="attention_mask must have rank 2"):
        translator.generate(ids, mask[None])
    with pytest.raises(ValueError, match="attention_mask shape"):
        translator.generate(ids, mask[:, :-1])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        translator.generate(ids + 100, mask)
    with pytest.raises(ValueError, match="Unknown generation options"):
        translator.generate(ids, mask, beams=4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        translator.generate(ids, mask, max_new_tokens=0)
    with pytest.raises(ValueError, match="list of strings"):
        translator.translate("a b c")


def test_unsupported_generation_config_is_refused(tmp_path):
    folder = tmp_path / "export"
    shutil.copytree(trained_export_dir(), folder)
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**generation, "no_repeat_ngram_size": 3}))
    with pytest.raises(ValueError, match="no_repeat_ngram_size"):
        OrtTranslator(folder)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_finished_sentences_leave_the_batch(translator, batch, monkeypatch, num_beams):
    """Sentences that finish early stop being decoded (the decoder's batch shrinks), and the outputs are those of
    decoding every row to the end."""
    from vanilla_transformer_ort.decoder_state import InPlaceState, NumpyState

    state_class = InPlaceState if translator.inplace else NumpyState
    rows = []
    run = state_class._run

    def counting_run(self, last_tokens):
        rows.append(last_tokens.shape[0])
        return run(self, last_tokens)

    monkeypatch.setattr(state_class, "_run", counting_run)
    ids, mask = batch[0].numpy(), batch[1].numpy()
    pruned = translator.generate(ids, mask, num_beams=num_beams, max_new_tokens=15)
    pruned_rows = rows[:]
    rows.clear()
    monkeypatch.setattr(state_class, "keep_rows", None)
    full = translator.generate(ids, mask, num_beams=num_beams, max_new_tokens=15)
    np.testing.assert_array_equal(pruned, full)
    assert set(rows) == {len(ids) * num_beams}  # without keep_rows: every row, every step
    assert pruned_rows[0] == len(ids) * num_beams and pruned_rows[-1] < pruned_rows[0]
    assert sum(pruned_rows) < sum(rows)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_inplace_cache_grows_and_stays_token_identical(model, batch, monkeypatch, num_beams):
    """The in-place decoder's buffers start small and double as outputs grow (here from 2 positions to 16); the
    tokens stay those of `generate()`, and no step ever copies the cache into new outputs."""
    from vanilla_transformer_ort.decoder_state import InPlaceState

    translator = OrtTranslator(trained_export_dir(), provider="cpu", decoder_cache="inplace")
    monkeypatch.setattr(translator, "INITIAL_CACHE_CAPACITY", 2)
    capacities, grow = [], InPlaceState._grow

    def recording_grow(self, needed):
        grow(self, needed)
        capacities.append(self.capacity)

    monkeypatch.setattr(InPlaceState, "_grow", recording_grow)
    expected = _generate(model, batch, num_beams=num_beams, max_new_tokens=15)
    actual = translator.generate(batch[0].numpy(), batch[1].numpy(), num_beams=num_beams, max_new_tokens=15)
    np.testing.assert_array_equal(actual, expected)
    assert capacities[:3] == [4, 8, 16]


def test_inplace_decoder_writes_into_the_bound_buffers(batch):
    """The present outputs are the past buffers themselves: after a step, the buffers hold the new position."""
    translator = OrtTranslator(trained_export_dir(), provider="cpu", decoder_cache="inplace")
    state = translator._start(batch[0].numpy(), batch[1].numpy(), num_beams=2, max_length=8)
    buffers = dict(state.buffers)
    before = {name: buffer.copy() for name, buffer in buffers.items()}
    start = np.full((batch[0].shape[0] * 2, 1), translator.settings.decoder_start_token_id)
    state.step(start)
    state.step(start)
    assert state.length == 2 and all(state.buffers[name] is buffer for name, buffer in buffers.items())
    for name, buffer in buffers.items():
        assert not np.array_equal(buffer[:, :, :2], before[name][:, :, :2]), name  # written in place
        np.testing.assert_array_equal(buffer[:, :, 2:], before[name][:, :, 2:])  # nothing beyond the length
        np.testing.assert_array_equal(buffer[0::2], buffer[1::2])  # both beams of a source: same cache


def test_inplace_decoder_refuses_a_folder_without_it(tmp_path):
    folder = tmp_path / "copy-only"
    shutil.copytree(trained_export_dir(), folder)
    (folder / "decoder_model_inplace.onnx").unlink()
    assert not OrtTranslator(folder, provider="cpu").inplace  # "auto" reads the folder as format version 1
    with pytest.raises(ValueError, match="decoder_model_inplace.onnx"):
        OrtTranslator(folder, provider="cpu", decoder_cache="inplace")
    with pytest.raises(ValueError, match="decoder_cache"):
        OrtTranslator(folder, provider="cpu", decoder_cache="fast")
