"""ONNX export: onnxruntime against PyTorch on a shape grid, graph names and dynamic dims, fp16/int8 variants, CLI."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from tests.onnx_helpers import (
    CONFIG,
    load_trained_model,
    trained_export_dir,
    trained_int8_export_dir,
    trained_model_dir,
)
from vanilla_transformer.export.onnx.export import export_model
from vanilla_transformer.export.onnx.helper_graphs import (
    beam_scores_block_size,
    beam_scores_model,
    write_beam_scores_graph,
)
from vanilla_transformer.export.onnx.validation import FP32_TOLERANCE, GridCase, validate_export, validation_grid
from vanilla_transformer_ort.contract import (
    BEAM_SCORES_FILE,
    DECODER_FILE,
    ENCODER_FILE,
    INPLACE_DECODER_FILE,
    MANIFEST_FILE,
    REORDER_FILE,
    SHARED_EMBEDDING_FILE,
    SHARED_WEIGHTS_KEY,
    decoder_input_names,
    decoder_output_names,
    encoder_output_names,
    external_data_file,
)

REPO = Path(__file__).resolve().parents[1]
LAYERS = CONFIG["decoder_layers"]


@pytest.fixture(scope="module")
def model():
    return load_trained_model()


@pytest.fixture(scope="module")
def export_dir() -> Path:
    return trained_export_dir()


def test_grid_covers_the_required_shapes():
    grid = validation_grid(CONFIG["max_position_embeddings"])
    assert any(c.batch > 1 and c.padded for c in grid)
    assert {c.past_len > 0 for c in grid} == {True, False}
    assert {c.target_len > 1 for c in grid} == {True, False}
    assert any(c.source_len > 12 and c.past_len + c.target_len > 12 for c in grid)


def test_fp32_matches_pytorch_on_the_grid(model, export_dir):
    summary = validate_export(model, export_dir)
    print({k: v for k, v in summary.items() if k != "cases"})
    assert len(summary["cases"]) == len(validation_grid(CONFIG["max_position_embeddings"]))
    for kind in ("encoder", "logits", "present"):
        assert summary[kind] < FP32_TOLERANCE, (kind, summary)


def test_validation_detects_a_different_model(export_dir):
    other = load_trained_model()
    with torch.no_grad():
        other.lm_head.weight.mul_(1.5)  # tied: embedding and output projection both change
    summary = validate_export(other, export_dir, grid=[GridCase(2, 6, 2, 3, True)])
    assert summary["logits"] > 1e-2


@torch.no_grad()
def test_step_by_step_decoding_matches_teacher_forced_forward(model, export_dir):
    """Independent of the cache: ORT one token at a time from an empty past == one full PyTorch forward."""
    input_ids = torch.tensor([[4, 5, 6, 7, 8, 2, 0], [9, 10, 2, 0, 0, 0, 0], [11, 12, 13, 14, 15, 16, 2]])
    attention_mask = (input_ids != 0).long()
    decoder_ids = torch.tensor([[1, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]] * 3)  # 14 > max positions
    expected = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_ids).logits

    encoder = ort.InferenceSession(str(export_dir / ENCODER_FILE), providers=["CPUExecutionProvider"])
    decoder = ort.InferenceSession(str(export_dir / DECODER_FILE), providers=["CPUExecutionProvider"])
    source = {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()}
    enc = dict(zip(encoder_output_names(LAYERS), encoder.run(None, source), strict=True))
    heads, d_head = CONFIG["decoder_attention_heads"], CONFIG["d_model"] // CONFIG["decoder_attention_heads"]
    past = {n: np.zeros((3, heads, 0, d_head), np.float32) for n in decoder_input_names(LAYERS) if ".decoder." in n}
    cross = {n.replace("present", "past_key_values"): v for n, v in enc.items() if ".encoder." in n}
    steps = []
    # a 3-token prefill, then single tokens
    for start, stop in [(0, 3)] + [(t, t + 1) for t in range(3, decoder_ids.shape[1])]:
        feed = {"input_ids": decoder_ids[:, start:stop].numpy(), "encoder_attention_mask": attention_mask.numpy()}
        outputs = dict(zip(decoder_output_names(LAYERS), decoder.run(None, {**feed, **past, **cross}), strict=True))
        past = {n.replace("present", "past_key_values"): v for n, v in outputs.items() if n != "logits"}
        steps.append(outputs["logits"])
    actual = np.concatenate(steps, axis=1)
    assert actual.shape == tuple(expected.shape)
    np.testing.assert_allclose(actual, expected.numpy(), atol=FP32_TOLERANCE, rtol=0)


def test_graph_names_and_dynamic_dimensions(export_dir):
    encoder = onnx.load(str(export_dir / ENCODER_FILE), load_external_data=False).graph
    decoder = onnx.load(str(export_dir / DECODER_FILE), load_external_data=False).graph
    assert [i.name for i in encoder.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in encoder.output] == encoder_output_names(LAYERS)
    assert [i.name for i in decoder.input] == decoder_input_names(LAYERS)
    assert [o.name for o in decoder.output] == decoder_output_names(LAYERS)
    assert "present.2.encoder.value" in encoder_output_names(LAYERS)
    assert "past_key_values.0.decoder.key" in decoder_input_names(LAYERS)
    for value in list(encoder.input) + list(decoder.input):  # batch and every length are symbolic
        dims = value.type.tensor_type.shape.dim
        dynamic = [d.dim_param for d in dims if d.dim_param]
        assert len(dynamic) == 2, (value.name, dims)  # (batch, len) or (batch, heads, len, d_head)
        if ".decoder." in value.name:
            assert dims[1].dim_value == CONFIG["decoder_attention_heads"]
            assert dims[3].dim_value == CONFIG["d_model"] // CONFIG["decoder_attention_heads"]


def test_optimized_decoder_reads_cached_keys_without_a_transpose(export_dir, tmp_path):
    """Q Kᵀ must fuse into one FusedMatMul: a Transpose on the cache copies every cached key on every step."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(export_dir / DECODER_FILE), options, providers=["CPUExecutionProvider"])
    graph = onnx.load(options.optimized_model_filepath, load_external_data=False).graph
    producers = {out: node for node in graph.node for out in node.output}

    def reads_cache(name: str, depth: int = 0) -> bool:  # a graph input, or a Concat/Reshape/Transpose of one
        if name.startswith("past_key_values."):
            return True
        node = producers.get(name)
        if node is None or depth > 4 or node.op_type not in ("Concat", "Reshape", "Transpose", "Identity"):
            return False
        return any(reads_cache(i, depth + 1) for i in node.input)

    transposed = [n.name for n in graph.node if n.op_type == "Transpose" and reads_cache(n.input[0])]
    assert transposed == []
    fused = [n for n in graph.node if n.op_type == "FusedMatMul" and reads_cache(n.input[1])]
    assert len(fused) == 2 * LAYERS  # self- and cross-attention scores of every layer


def test_cache_reorder_graph_gathers_rows(export_dir):
    session = ort.InferenceSession(str(export_dir / REORDER_FILE), providers=["CPUExecutionProvider"])
    heads, d_head = CONFIG["decoder_attention_heads"], CONFIG["d_model"] // CONFIG["decoder_attention_heads"]
    rng = np.random.default_rng(0)
    past = {
        n: rng.standard_normal((3, heads, 4, d_head)).astype(np.float32)
        for n in decoder_input_names(LAYERS)
        if ".decoder." in n
    }
    rows = np.array([2, 2, 0, 1], dtype=np.int64)
    outputs = dict(
        zip([o.name for o in session.get_outputs()], session.run(None, {"beam_idx": rows, **past}), strict=True)
    )
    assert len(outputs) == 2 * LAYERS
    for name, value in past.items():
        np.testing.assert_array_equal(outputs[name.replace("past_key_values", "reordered")], value[rows])


def _rank_like_transformers(logits, running, bias, batch, k):
    """numpy reference: log_softmax(last logits) + bias + running scores, top k per sentence, ties to lower index."""
    last = logits[:, -1, :].astype(np.float64)
    log_probs = last - last.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    scores = (log_probs + bias + running).reshape(batch, -1)
    order = np.lexsort((np.broadcast_to(np.arange(scores.shape[1]), scores.shape), -scores), axis=1)[:, :k]
    return np.take_along_axis(scores, order, axis=1), order


def _run_beam_scores(folder, logits, running, bias, batch, k):
    session = ort.InferenceSession(str(folder / BEAM_SCORES_FILE), providers=["CPUExecutionProvider"])
    feed = {"logits": logits, "running_scores": running, "bias": bias}
    feed |= {"scores_shape": np.array([batch, -1], dtype=np.int64), "k": np.array([k], dtype=np.int64)}
    return session.run(None, feed)


def _beam_step_inputs(dtype, batch=3, beams=4, vocab=50):
    """Logits with exact ties (repeated columns, repeated beams) and a banned token, over 2 new positions."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((batch * beams, 2, vocab)).astype(dtype)
    logits[:, :, 7] = logits[:, :, 3]  # equal scores inside a row
    logits[1] = logits[0]  # two beams of sentence 0 with equal logits and (below) equal running scores
    running = rng.standard_normal((batch * beams, 1)).astype(np.float32)
    running[1] = running[0]
    bias = np.zeros(vocab, dtype=np.float32)
    bias[[2, 11]] = -np.inf  # banned tokens (min_new_tokens bans EOS this way)
    return logits, running, bias


@pytest.mark.parametrize("first_step", [False, True])
def test_beam_scores_graph_ranks_like_transformers(export_dir, first_step):
    """Ties inside a row and across beams; at the first step only beam 0 of a sentence runs (the others' running
    scores are -1e9), so all k best of a sentence come from one row."""
    logits, running, bias = _beam_step_inputs(np.float32)
    if first_step:
        running = np.where(np.arange(len(running))[:, None] % 4 == 0, 0.0, -1e9).astype(np.float32)
    values, indices = _run_beam_scores(export_dir, logits, running, bias, batch=3, k=8)
    expected_values, expected_indices = _rank_like_transformers(logits, running, bias, batch=3, k=8)
    np.testing.assert_array_equal(indices, expected_indices)
    np.testing.assert_allclose(values, expected_values, rtol=0, atol=1e-5)
    assert values.dtype == np.float32 and indices.dtype == np.int64
    vocab = logits.shape[-1]
    assert not np.isin(indices % vocab, [2, 11]).any()


def _scores_session(vocab, block_size, logits_type=onnx.TensorProto.FLOAT, opset=20):
    model = beam_scores_model(logits_type, vocab, [onnx.helper.make_opsetid("", opset)], 9, block_size=block_size)
    onnx.checker.check_model(model)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("opset", [17, 20])  # ReduceMax's axes: an attribute before opset 18, an input from it
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("first_step", [False, True])
def test_two_stage_beam_scores_equal_one_stage_to_the_bit(first_step, dtype, opset):
    """The block-maximum top k against the single TopK over every candidate: the same values to the bit and the same
    indices, on logits full of exact ties (rounded values, repeated rows and beams), banned tokens, and at the first
    step (one live beam per sentence); and both against a float64 numpy ranking."""
    vocab, block, batch, beams, k = 96, 16, 5, 4, 8
    one_stage = _scores_session(vocab, None, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), opset)
    two_stage = _scores_session(vocab, block, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), opset)
    rng = np.random.default_rng(0)
    for trial in range(40):
        scale = (0.5, 2.0, 8.0)[trial % 3]
        logits = np.round(rng.standard_normal((batch * beams, 2, vocab)) * scale).astype(dtype)
        logits[1] = logits[0]  # equal beams
        running = np.round(rng.standard_normal((batch * beams, 1)) * scale).astype(np.float32)
        running[1] = running[0]
        if first_step:
            running = np.where(np.arange(batch * beams)[:, None] % beams == 0, 0.0, -1e9).astype(np.float32)
        bias = np.zeros(vocab, dtype=np.float32)
        bias[[2, 17, 40]] = -np.inf
        feed = {"logits": logits, "running_scores": running, "bias": bias}
        feed |= {"scores_shape": np.array([batch, -1], dtype=np.int64), "k": np.array([k], dtype=np.int64)}
        expected_values, expected_indices = one_stage.run(None, feed)
        values, indices = two_stage.run(None, feed)
        np.testing.assert_array_equal(indices, expected_indices)
        np.testing.assert_array_equal(values, expected_values)  # to the bit
        reference_values, reference_indices = _rank_like_transformers(logits, running, bias, batch=batch, k=k)
        np.testing.assert_allclose(values, reference_values, rtol=0, atol=1e-5)
        assert not np.isin(indices % vocab, [2, 17, 40]).any()


def test_beam_scores_block_size_is_a_divisor_near_64():
    assert beam_scores_block_size(8000) == 64 and beam_scores_block_size(32000) == 64
    assert beam_scores_block_size(58101) == 107  # OPUS-MT en-de's vocabulary: 3 x 107 x 181
    assert beam_scores_block_size(100) == 25 and beam_scores_block_size(37) is None  # 37 is prime
    assert beam_scores_block_size(None) is None
    with pytest.raises(ValueError, match="must divide"):
        beam_scores_model(onnx.TensorProto.FLOAT, 100, [onnx.helper.make_opsetid("", 20)], 9, block_size=30)


def test_beam_scores_graph_takes_two_stages_where_the_vocabulary_allows(export_dir, tmp_path):
    """The exported graph: one TopK for the fixture's vocabulary of 37 (prime), two stages for 8,000."""
    ops = {n.op_type for n in onnx.load(str(export_dir / BEAM_SCORES_FILE)).graph.node}
    assert "ReduceMax" not in ops
    decoder = onnx.load(str(export_dir / DECODER_FILE), load_external_data=False)
    decoder.graph.output[0].type.tensor_type.shape.dim[-1].dim_value = 8000
    onnx.save(decoder, str(tmp_path / DECODER_FILE))
    graph = onnx.load(str(write_beam_scores_graph(tmp_path))).graph
    assert "ReduceMax" in {n.op_type for n in graph.node}
    assert graph.input[0].type.tensor_type.shape.dim[-1].dim_value == 8000


def test_export_folder_is_self_contained(export_dir):
    graphs = (ENCODER_FILE, DECODER_FILE, REORDER_FILE, BEAM_SCORES_FILE)
    for name in (*graphs, "config.json", "generation_config.json", "tokenizer.json"):
        assert (export_dir / name).is_file(), name
    assert (export_dir / MANIFEST_FILE).is_file()
    manifest = json.loads((export_dir / MANIFEST_FILE).read_text())
    assert manifest["dtype"] == "fp32" and manifest["quantization"] is None and manifest["opset"] == 20
    assert manifest["decoder_layers"] == LAYERS
    assert manifest["files"][DECODER_FILE] == (export_dir / DECODER_FILE).stat().st_size
    io = manifest["graphs"][DECODER_FILE]
    assert [i["name"] for i in io["inputs"]] == decoder_input_names(LAYERS)
    assert io["inputs"][2]["dtype"] == "FLOAT" and io["inputs"][0]["dtype"] == "INT64"
    assert manifest["validation"]["fp32"]["logits"] < FP32_TOLERANCE
    # format version 2: the in-place decoder too, checked on the same grid (its beams sharing one cross K/V); 3: its
    # per-row lengths
    assert manifest["format_version"] == 3 and manifest["decoder_cache"] == "inplace"
    assert (export_dir / INPLACE_DECODER_FILE).is_file()
    inplace_inputs = [i["name"] for i in manifest["graphs"][INPLACE_DECODER_FILE]["inputs"]]
    assert (
        inplace_inputs
        == decoder_input_names(LAYERS)[:2]
        + ["total_sequence_length", "sequence_lengths"]
        + decoder_input_names(LAYERS)[2:]
    )
    validation = manifest["validation"]["fp32"]
    assert validation["inplace_logits"] < FP32_TOLERANCE and validation["inplace_present"] < FP32_TOLERANCE


def _inplace_step(session, tokens, lengths, cross, mask, buffers) -> np.ndarray:
    """One step of the in-place decoder over numpy buffers (bound, so written in place); the last logits per row."""
    binding = session.io_binding()
    feed = {
        "input_ids": np.asarray(tokens, dtype=np.int64)[:, None],
        "encoder_attention_mask": mask,
        "total_sequence_length": np.array(max(lengths), np.int32),
        "sequence_lengths": np.asarray(lengths, np.int32),
    }
    for name, value in {**feed, **cross}.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value))
    for name, buffer in buffers.items():
        value = ort.OrtValue.ortvalue_from_numpy(buffer)
        binding.bind_ortvalue_input(name, value)
        binding.bind_ortvalue_output(name.replace("past_key_values.", "present.", 1), value)
    binding.bind_output("logits", "cpu")
    session.run_with_iobinding(binding)
    return np.array(binding.get_outputs()[0].numpy()[:, -1])  # a copy: onnxruntime frees its outputs' memory


def test_inplace_rows_of_different_lengths_decode_as_each_alone(export_dir):
    """A row that joins a running batch (its own past length, its source padded to the batch's) gets the logits it
    gets alone, to the bit, and so does the row it joined: per-row lengths place each row's positions and cache."""
    options = ort.SessionOptions()
    encoder, decoder = (
        ort.InferenceSession(str(export_dir / name), options, providers=["CPUExecutionProvider"])
        for name in (ENCODER_FILE, INPLACE_DECODER_FILE)
    )
    heads, d_head = CONFIG["decoder_attention_heads"], CONFIG["d_model"] // CONFIG["decoder_attention_heads"]
    names = decoder_input_names(LAYERS)[2:]  # past_key_values.{i}.{decoder,encoder}.{key,value}
    cross_names = [n for n in names if ".encoder." in n]
    own_names = [n for n in names if ".decoder." in n]

    def encode(ids):
        ids = np.asarray([ids], dtype=np.int64)
        outputs = encoder.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[1:]
        return dict(zip(cross_names, outputs, strict=True))

    sources, steps = ([5, 6, 7, 8, 9, 2], [9, 10, 2]), ([1, 7, 8, 9, 10], [1, 11, 12])
    crosses = [encode(ids) for ids in sources]
    alone = []
    for cross, tokens, ids in zip(crosses, steps, sources, strict=True):
        buffers = {name: np.zeros((1, heads, 8, d_head), np.float32) for name in own_names}
        mask = np.ones((1, len(ids)), np.int64)
        alone.append([_inplace_step(decoder, [t], [k + 1], cross, mask, buffers)[0] for k, t in enumerate(tokens)])
    # The first row decodes two steps alone, then the second joins with its shorter source padded to the first's.
    buffers = {name: np.zeros((2, heads, 8, d_head), np.float32) for name in own_names}
    cross = {name: np.zeros((2, heads, 6, d_head), np.float32) for name in cross_names}
    for name in cross_names:
        cross[name][0], cross[name][1, :, :3] = crosses[0][name][0], crosses[1][name][0]
    mask = np.array([[1] * 6, [1, 1, 1, 0, 0, 0]], np.int64)
    first = {name: value[:1] for name, value in cross.items()}
    together = [[], []]
    for k in range(2):
        together[0].append(_inplace_step(decoder, [steps[0][k]], [k + 1], first, mask[:1],
                                         {n: b[:1] for n, b in buffers.items()})[0])  # fmt: skip
    for k in range(3):
        logits = _inplace_step(decoder, [steps[0][k + 2], steps[1][k]], [k + 3, k + 1], cross, mask, buffers)
        together[0].append(logits[0])
        together[1].append(logits[1])
    for row in (0, 1):
        assert all(np.array_equal(a, b) for a, b in zip(together[row], alone[row], strict=True)), row


def test_fp32_folder_stores_the_shared_embedding_once(export_dir):
    """§3.4's one embedding matrix: every graph's table reads one raw file, the in-place decoder's output projection
    reads its lookup's table, and no graph holds a (vocab, d_model) matrix of its own."""
    manifest = json.loads((export_dir / MANIFEST_FILE).read_text())
    shared = manifest[SHARED_WEIGHTS_KEY]
    vocab, d_model = CONFIG["vocab_size"], CONFIG["d_model"]
    assert shared["shape"] == [vocab, d_model] and shared["dtype"] == "float32"
    assert set(shared["initializers"]) == {ENCODER_FILE, DECODER_FILE, INPLACE_DECODER_FILE}
    table = np.fromfile(export_dir / shared["file"], dtype=np.float32).reshape(vocab, d_model)
    model = load_trained_model()
    np.testing.assert_array_equal(table, model.get_input_embeddings().weight.detach().numpy())
    for graph_file, names in shared["initializers"].items():
        graph = onnx.load(str(export_dir / graph_file), load_external_data=False).graph
        tables = [t for t in graph.initializer if vocab in t.dims and d_model in t.dims]
        external = {t.name: {e.key: e.value for e in t.external_data} for t in tables}
        assert set(names) <= set(external), graph_file
        assert all(external[name]["location"] == shared["file"] for name in names), graph_file
        # the graph's other weights sit in its own side file, none inline
        inline = [t.name for t in graph.initializer if t.HasField("raw_data") and len(t.raw_data) >= 1024]
        assert inline == [], (graph_file, inline)
        side_file = export_dir / external_data_file(graph_file)
        if side_file.exists():  # the in-place decoder reads the plain decoder's side file and has none of its own
            assert side_file.stat().st_mode == (export_dir / graph_file).stat().st_mode  # as readable as the graph
        if graph_file == INPLACE_DECODER_FILE:
            assert [t.name for t in tables] == names  # one table: the lookup's, also the projection's
            consumers = sorted(n.op_type for n in graph.node if names[0] in n.input)
            assert consumers == ["FusedMatMul", "Gather"]


def test_fp32_folder_stores_each_weight_once(export_dir):
    """The plain and the in-place decoder graphs hold the same decoder: every weight's bytes are stored in one place
    of the folder's external data, the in-place graph's packed Q, K, V projection is a Concat of the stored three,
    and the in-place graph writes no side file of its own."""
    places: dict[tuple, set] = {}
    for graph_file in (ENCODER_FILE, DECODER_FILE, INPLACE_DECODER_FILE):
        graph = onnx.load(str(export_dir / graph_file), load_external_data=False).graph
        for tensor in graph.initializer:
            where = {e.key: e.value for e in tensor.external_data}
            if not where:
                continue
            offset, length = int(where.get("offset", 0)), int(where["length"])
            data = np.fromfile(export_dir / where["location"], dtype=np.uint8, count=length, offset=offset)
            places.setdefault((tensor.data_type, tuple(tensor.dims), data.tobytes()), set()).add(
                (where["location"], offset)
            )
    assert places and all(len(where) == 1 for where in places.values())
    assert not (export_dir / external_data_file(INPLACE_DECODER_FILE)).exists()
    inplace = onnx.load(str(export_dir / INPLACE_DECODER_FILE), load_external_data=False).graph
    stored = {
        t.name: {e.key: e.value for e in t.external_data}["location"] for t in inplace.initializer if t.external_data
    }
    assert set(stored.values()) == {external_data_file(DECODER_FILE), SHARED_EMBEDDING_FILE}
    packed = [node for node in inplace.node if node.op_type == "Concat" and node.name.endswith(".concat")]
    assert len(packed) == CONFIG["decoder_layers"]  # one packed Q, K, V projection per decoder layer
    assert all(len(node.input) == 3 and set(node.input) <= set(stored) for node in packed)


def _variant(tmp_path: Path, dtype: str, quantize: str | None, activations: str = "row") -> Path:
    """What `export_model` writes for a variant (int8 folders: the shared cached exports, not to be modified)."""
    if quantize:
        return trained_int8_export_dir(activations)
    target = tmp_path / f"{dtype}-{activations}"
    export_model(trained_model_dir(), target, dtype=dtype)
    return target


def _weight_bytes(folder: Path, graph_file: str) -> int:
    """Bytes a graph's weights take on disk: the graph, its external data and the shared table it reads, if any."""
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    shared = manifest.get(SHARED_WEIGHTS_KEY, {})
    files = [graph_file, external_data_file(graph_file)]
    files += [shared["file"]] if graph_file in shared.get("initializers", {}) else []
    return sum((folder / name).stat().st_size for name in files if (folder / name).is_file())


def test_fp16_variant_runs_close_to_pytorch(model, export_dir, tmp_path):
    folder = _variant(tmp_path, "fp16", None)
    decoder = onnx.load(str(folder / DECODER_FILE)).graph
    assert decoder.input[2].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16  # KV cache in fp16
    assert decoder.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT16
    summary = validate_export(model, folder)
    print({k: v for k, v in summary.items() if k != "cases"})
    assert summary["logits"] < 2e-2 and summary["present"] < 5e-2
    matrices = [i for i in decoder.initializer if len(i.dims) == 2]  # the weights: all stored in fp16
    assert matrices and all(i.data_type == onnx.TensorProto.FLOAT16 for i in matrices)
    # the beam-scores helper takes the fp16 logits as they come out of the decoder, and ranks in fp32
    write_beam_scores_graph(folder)
    logits, running, bias = _beam_step_inputs(np.float16)
    values, indices = _run_beam_scores(folder, logits, running, bias, batch=3, k=8)
    expected_values, expected_indices = _rank_like_transformers(logits, running, bias, batch=3, k=8)
    np.testing.assert_array_equal(indices, expected_indices)
    np.testing.assert_allclose(values, expected_values, rtol=0, atol=1e-5)


def test_int8_variant_has_its_own_output_projection_and_runs(model, export_dir, tmp_path):
    folder = _variant(tmp_path, "fp32", "int8")
    graph = onnx.load(str(folder / DECODER_FILE)).graph
    assert any(n.op_type == "MatMulInteger" for n in graph.node)
    producers = {out: node for node in graph.node for out in node.output}
    # logits come from a quantized matmul whose weight is not shared with the embedding lookup
    initializers = {i.name for i in graph.initializer}
    lookup_tables = {n.input[0] for n in graph.node if n.op_type == "Gather" and n.input[0] in initializers}
    node, weights = producers["logits"], set()
    for _ in range(6):
        weights |= {i for i in node.input if i in initializers}
        node = next((producers[i] for i in node.input if i in producers and producers[i].op_type != "Shape"), None)
        if node is None:
            break
    assert weights and not weights & lookup_tables
    # no node left without a consumer (onnxruntime would run it anyway, e.g. a dequantized transposed table)
    consumed = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    assert [n.name for n in graph.node if not set(n.output) & consumed] == []
    inplace = onnx.load(str(folder / INPLACE_DECODER_FILE)).graph
    assert any(n.op_type == "MatMulInteger" for n in inplace.node)
    for quantized in (graph, inplace, onnx.load(str(folder / ENCODER_FILE)).graph):  # zero points: one per kind
        ops = [n.op_type for n in quantized.node]
        assert ops.count("QuantizeLinear") > 2 and ops.count("ConstantOfShape") == 2
    summary = validate_export(model, folder)
    print({k: v for k, v in summary.items() if k != "cases"})
    assert summary["logits"] < 0.5 and summary["inplace_logits"] < 0.5
    assert _weight_bytes(folder, DECODER_FILE) < _weight_bytes(export_dir, DECODER_FILE)


def _graph_rows(path: Path, feed: dict[str, np.ndarray], rows: list[int]) -> list[np.ndarray]:
    """Every output of a graph run on the whole batch, and on each of `rows` alone (a batch of one)."""
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    together = session.run(None, feed)
    alone = [session.run(None, {k: v[r : r + 1] for k, v in feed.items()}) for r in rows]
    return [(together[i][r], out[i][0]) for r, out in zip(rows, alone, strict=True) for i in range(len(together))]


@pytest.mark.parametrize("activations", ["row", "tensor"])
def test_int8_activations_per_row_do_not_depend_on_the_batch(export_dir, tmp_path, activations):
    """With one activation scale per row, a sentence's encoder outputs and logits are the same alone as in a batch
    whose other rows hold much larger values; with one scale per tensor they are not (the server's batches mix
    requests, so the same text could get another translation)."""
    folder = _variant(tmp_path, "fp32", "int8", activations)
    graphs = {name: onnx.load(str(folder / name)).graph for name in (ENCODER_FILE, DECODER_FILE)}
    quantizers = [n for graph in graphs.values() for n in graph.node if n.op_type == "DynamicQuantizeLinear"]
    assert (quantizers == []) == (activations == "row")
    rng = np.random.default_rng(0)
    ids = rng.integers(4, CONFIG["vocab_size"], (3, 6))
    ids[1] = ids[0]  # row 1 = row 0; row 2 differs (other values, other scales)
    pairs = _graph_rows(folder / ENCODER_FILE, {"input_ids": ids, "attention_mask": np.ones_like(ids)}, [0, 1])
    differences = [float(np.abs(together - alone).max()) for together, alone in pairs]
    if activations == "row":
        assert max(differences) == 0.0
    else:  # row 2 sets the scale; rows 0 and 1 alone get another one
        assert max(differences) > 0.0


def _row_quantized_linear(x: np.ndarray, weight: np.ndarray, weight_scale, weight_zero_point, bias, levels: int):
    """The per-row int8 product as documented (docs/onnx.md, "int8 and fp16"), in numpy: scale max|x_row| / 127
    and zero point 128 (levels=127), or max(x_row) / 255 and zero point 0 for a ReLU's output (levels=255)."""
    scale = np.maximum(np.abs(x).max(axis=-1, keepdims=True) / np.float32(levels), np.finfo(np.float32).tiny)
    q = np.clip(np.rint(x / scale), -127 if levels == 127 else 0, levels).astype(np.int64)  # rint: half to even
    product = q @ (weight.astype(np.int64) - weight_zero_point)
    return (product.astype(np.float32) * (scale * np.float32(weight_scale)) + bias).astype(np.float32)


def test_int8_rows_follow_the_documented_arithmetic(tmp_path):
    """A linear layer, ReLU and another linear layer quantized per row, run by onnxruntime with every fusion on, equal
    the formula computed in numpy: the signed rows (scale max|x| / 127, zero point 128), the ReLU's rows (all 256
    levels on [0, max]), the biases (onnxruntime 1.32 fused them wrongly into MatMulIntegerToFloat with per-row
    scales) and a row of zeros; and each row's result is the same alone."""
    from onnx import TensorProto, helper, numpy_helper

    from vanilla_transformer.export.onnx.variants import quantize_activations_per_row, quantize_int8

    rng = np.random.default_rng(0)
    d_in, d_ff = 24, 40
    weights = {
        "w1": rng.standard_normal((d_in, d_ff)).astype(np.float32) * 0.2,
        "b1": rng.standard_normal(d_ff).astype(np.float32),
        "w2": rng.standard_normal((d_ff, d_in)).astype(np.float32) * 0.2,
        "b2": rng.standard_normal(d_in).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"]),
        helper.make_node("Add", ["h1", "b1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y1"]),
        helper.make_node("Add", ["y1", "b2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "ffn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "length", d_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "length", d_in])],
        [numpy_helper.from_array(value, name) for name, value in weights.items()],
    )
    path = tmp_path / "ffn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(path))
    quantize_int8(path)
    assert quantize_activations_per_row(path) == 2
    model = onnx.load(str(path))
    assert next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) == 21
    assert [n.op_type for n in model.graph.node].count("QuantizeLinear") == 2
    assert not any(n.op_type == "DynamicQuantizeLinear" for n in model.graph.node)

    stored = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    quantized = {name: [stored[f"{name}_quantized"], stored[f"{name}_scale"], stored[f"{name}_zero_point"]]
                 for name in ("w1", "w2")}  # fmt: skip
    x = (rng.standard_normal((3, 5, d_in)) + 0.3).astype(np.float32)
    x[1, 2] = 0.0  # a row of zeros: the floored scale, q = zero point
    x[2, 0] *= 1000.0  # a row with a far larger range than the others
    hidden = _row_quantized_linear(x, *quantized["w1"], weights["b1"], 127)
    expected = _row_quantized_linear(np.maximum(hidden, 0), *quantized["w2"], weights["b2"], 255)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])  # every fusion on
    together = session.run(None, {"x": x})[0]
    # The fused kernel multiplies by the two scales in another order: a hidden value within an ulp of a rounding
    # boundary may take the next level, so each output may be off by one level of one ReLU input (the large row does)
    weight, weight_scale = quantized["w2"][0], quantized["w2"][1]
    one_level = np.maximum(hidden, 0).max(axis=-1, keepdims=True) / 255 * weight_scale * np.abs(weight).max()
    assert np.all(np.abs(together - expected) <= 1.01 * one_level + 1e-5)
    assert np.mean(np.abs(together - expected) <= 1e-5) > 0.9  # and almost all of them exactly
    alone = np.stack([session.run(None, {"x": x[b : b + 1]})[0][0] for b in range(3)])
    np.testing.assert_array_equal(alone, together)


def test_int8_rows_of_different_shapes_are_refused(tmp_path):
    """The per-row zero points are shared by a graph's quantized products: rows of two shapes cannot share them."""
    from onnx import TensorProto, helper, numpy_helper

    from vanilla_transformer.export.onnx.variants import quantize_activations_per_row, quantize_int8

    weight = np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", [x, "w"], [f"{x}_out"]) for x in ("x", "memory")],
        "two_row_shapes",
        [
            helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", length, 8])
            for x, length in (("x", "length"), ("memory", "source_length"))
        ],  # fmt: skip
        [helper.make_tensor_value_info(f"{x}_out", TensorProto.FLOAT, None) for x in ("x", "memory")],
        [numpy_helper.from_array(weight, "w")],
    )
    path = tmp_path / "two.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(path))
    quantize_int8(path)
    with pytest.raises(ValueError, match="rows of different shapes"):
        quantize_activations_per_row(path)


def test_untie_output_projection_replaces_the_transposed_table(tmp_path):
    """At base size the exporter keeps `MatMul(h, Transpose(table))` (too large to fold): untying must give the
    MatMul a pre-transposed copy and drop the Transpose, with unchanged outputs."""
    from onnx import TensorProto, helper, numpy_helper

    from vanilla_transformer.export.onnx.variants import untie_output_projection

    table = np.random.default_rng(0).standard_normal((11, 6)).astype(np.float32)  # (vocab, d_model)
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["hidden"]),
        helper.make_node("Transpose", ["table"], ["table_t"], perm=[1, 0]),
        helper.make_node("MatMul", ["hidden", "table_t"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tied",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 11])],
        [numpy_helper.from_array(table, "table")],
    )
    path = tmp_path / "tied.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(path))
    ids = np.array([3, 0, 10], dtype=np.int64)
    before = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input_ids": ids})[0]

    assert untie_output_projection(path)
    untied = onnx.load(str(path)).graph
    assert [n.op_type for n in untied.node] == ["Gather", "MatMul"]
    weight = next(i for i in untied.initializer if i.name == untied.node[1].input[1])
    np.testing.assert_array_equal(numpy_helper.to_array(weight), table.T)
    after = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input_ids": ids})[0]
    np.testing.assert_array_equal(after, before)


def test_export_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="dtype"):
        export_model(trained_model_dir(), tmp_path / "a", dtype="bf16")
    with pytest.raises(ValueError, match="fp16"):
        export_model(trained_model_dir(), tmp_path / "b", dtype="fp16", quantize="int8")
    with pytest.raises(ValueError, match="config.json"):
        export_model(tmp_path, tmp_path / "c")
    no_tokenizer = tmp_path / "model"
    shutil.copytree(trained_model_dir(), no_tokenizer)
    (no_tokenizer / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="tokenizer.json"):
        export_model(no_tokenizer, tmp_path / "d")


def test_cli_help():
    result = subprocess.run(
        [sys.executable, str(REPO / "export/export_onnx.py"), "--help"], capture_output=True, text=True, check=True
    )
    assert "--quantize" in result.stdout and "--validate" in result.stdout


@pytest.mark.slow
def test_cli_int8_export_end_to_end(tmp_path):
    output = tmp_path / "int8"
    result = subprocess.run(
        [sys.executable, str(REPO / "export/export_onnx.py"), "--model", str(trained_model_dir()), "--output",
         str(output), "--quantize", "int8", "--validate"],
        capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "max |onnxruntime - PyTorch| fp32" in result.stdout and "MiB" in result.stdout
    manifest = json.loads((output / MANIFEST_FILE).read_text())
    assert manifest["quantization"] == "int8-dynamic-per-row"


def test_folder_assembly_does_not_import_validation():
    """Validation is a separate last step: the assembly module never imports it (no import circle)."""
    code = (
        "import sys, vanilla_transformer.export.onnx.export\n"
        "assert 'vanilla_transformer.export.onnx.validation' not in sys.modules, sorted(sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
