"""fp32 weights outside the graphs, each stored once: the shared embedding table in one file, every other weight
beside the first graph that holds it.

The paper ties one embedding matrix to the encoder's input, the decoder's input and the output projection (§3.4).
Inlined, an export stores it once per graph (three times with the in-place decoder's lookup and its projection);
here every graph's copy of the table points, as ONNX external data, at one raw file (`SHARED_EMBEDDING_FILE`) and
the runtime hands the sessions one buffer of it (`SessionOptions.add_initializer`). The graphs' other weights go to
`<graph>.data`: onnxruntime then reads them straight into place instead of first parsing a protobuf of the whole
graph, which held every weight twice while a session loaded. The two decoder graphs hold the same decoder: the
in-place graph's weights point into `decoder_model.onnx.data`, and its packed Q, K, V projection becomes a `Concat`
of the three projections stored there (a constant that onnxruntime folds when the session loads). Any onnxruntime
opens the folder as it is: it resolves the external data next to each graph.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np

from vanilla_transformer_ort.contract import (
    DECODER_FILE,
    ENCODER_FILE,
    INPLACE_DECODER_FILE,
    SHARED_EMBEDDING_FILE,
    external_data_file,
)

# Initializers smaller than this stay inside the graph (onnx's own default threshold).
EXTERNAL_MIN_BYTES = 1024


def _point_at(tensor, location: str, length: int, offset: int = 0) -> None:
    """Make an initializer read its data from `location` (`length` bytes at `offset`) instead of its own bytes."""
    from onnx import TensorProto

    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def _content_key(array: np.ndarray) -> tuple:
    """What makes two initializers the same weight: dtype, shape and bytes."""
    array = np.ascontiguousarray(array)
    return array.dtype.str, array.shape, hashlib.sha256(array.tobytes()).hexdigest()


def _stored_weights(path: Path) -> dict[tuple, tuple[str, int, int]]:
    """Content key -> (file, offset, length) of each weight that the saved graph at `path` keeps in its own side
    file (`<graph>.data`), read from that file."""
    import onnx
    from onnx import helper

    stored = {}
    for tensor in onnx.load(str(path), load_external_data=False).graph.initializer:
        where = {entry.key: entry.value for entry in tensor.external_data}
        if where.get("location") != external_data_file(path.name):
            continue
        offset, length = int(where.get("offset", 0)), int(where["length"])
        dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
        data = np.fromfile(path.with_name(where["location"]), dtype=np.uint8, count=length, offset=offset)
        stored[_content_key(data.view(dtype).reshape(tuple(tensor.dims)))] = (where["location"], offset, length)
    return stored


def _share_with(model, stored: dict[tuple, tuple[str, int, int]]) -> int:
    """Point `model`'s initializers that another graph already stores at that storage; an initializer that is the
    concatenation of stored weights along its last axis (the in-place decoder's packed Q, K, V projection) becomes
    a `Concat` of them. Returns how many initializers now read another graph's file."""
    from onnx import helper, numpy_helper

    shared, concats = 0, []
    for tensor in list(model.graph.initializer):
        if not tensor.HasField("raw_data") or len(tensor.raw_data) < EXTERNAL_MIN_BYTES:
            continue
        array = numpy_helper.to_array(tensor)
        key = _content_key(array)
        if key in stored:
            _point_at(tensor, stored[key][0], stored[key][2], stored[key][1])
            shared += 1
            continue
        parts = np.split(array, 3, axis=-1) if array.shape and array.shape[-1] % 3 == 0 else []
        if parts and all(_content_key(part) in stored for part in parts):
            names = [f"{tensor.name}.{part}" for part in ("q", "k", "v")]
            for name, part in zip(names, parts, strict=True):
                piece = numpy_helper.from_array(np.ascontiguousarray(part), name)
                location, offset, length = stored[_content_key(part)]
                _point_at(piece, location, length, offset)
                model.graph.initializer.append(piece)
            concats.append(helper.make_node("Concat", names, [tensor.name], name=f"{tensor.name}.concat", axis=-1))
            model.graph.initializer.remove(tensor)
            shared += 3
    if concats:  # constants first, before the nodes that read them
        nodes = concats + list(model.graph.node)
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return shared


def store_weights_externally(output_dir: str | Path, table: np.ndarray) -> dict[str, list[str]]:
    """Rewrite the folder's fp32 encoder and decoder graphs with external weights; returns, per graph file, the
    initializers that now read the shared embedding `table` (vocab, d_model) from `SHARED_EMBEDDING_FILE`.

    An initializer shares the file when it holds exactly `table` (same shape and values); the output projection of
    the in-place decoder reads the same initializer (a `FusedMatMul` with transB), so it has no copy of its own.
    """
    import onnx
    from onnx import external_data_helper, numpy_helper

    output_dir = Path(output_dir)
    table = np.ascontiguousarray(table, dtype=np.float32)
    shared: dict[str, list[str]] = {}
    decoder_weights: dict[tuple, tuple[str, int, int]] = {}
    for graph_file in (ENCODER_FILE, DECODER_FILE, INPLACE_DECODER_FILE):
        path = output_dir / graph_file
        if not path.is_file():
            continue
        model = onnx.load(str(path))
        names = []
        for tensor in model.graph.initializer:
            if tuple(tensor.dims) == table.shape and np.array_equal(numpy_helper.to_array(tensor), table):
                _point_at(tensor, SHARED_EMBEDDING_FILE, table.nbytes)
                names.append(tensor.name)
        if graph_file == INPLACE_DECODER_FILE:
            _share_with(model, decoder_weights)  # the same decoder as decoder_model.onnx: its weights, stored once
        data_file = output_dir / external_data_file(graph_file)
        data_file.unlink(missing_ok=True)  # onnx appends to an existing file
        external_data_helper.convert_model_to_external_data(
            model, all_tensors_to_one_file=True, location=data_file.name, size_threshold=EXTERNAL_MIN_BYTES
        )
        onnx.save(model, str(path))
        if data_file.is_file():
            shutil.copymode(path, data_file)  # onnx creates it private (0600); readable like the graph beside it
        if graph_file == DECODER_FILE:
            decoder_weights = _stored_weights(path)
        if names:
            shared[graph_file] = names
    if shared:
        table.tofile(output_dir / SHARED_EMBEDDING_FILE)
    return shared
