"""fp32 weights outside the graphs: the shared embedding table stored once, every other weight beside its graph.

The paper ties one embedding matrix to the encoder's input, the decoder's input and the output projection (§3.4).
Inlined, an export stores it once per graph (three times with the in-place decoder's lookup and its projection);
here every graph's copy of the table points, as ONNX external data, at one raw file (`SHARED_EMBEDDING_FILE`) and
the runtime hands the sessions one buffer of it (`SessionOptions.add_initializer`). The graphs' other weights go to
`<graph>.data`: onnxruntime then reads them straight into place instead of first parsing a protobuf of the whole
graph, which held every weight twice while a session loaded. Any onnxruntime opens the folder as it is: it resolves
the external data next to each graph.
"""

from __future__ import annotations

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


def _point_at(tensor, location: str, length: int) -> None:
    """Make an initializer read its data from `location` (offset 0, `length` bytes) instead of its own bytes."""
    from onnx import TensorProto

    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    del tensor.external_data[:]
    for key, value in (("location", location), ("offset", "0"), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


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
        data_file = output_dir / external_data_file(graph_file)
        data_file.unlink(missing_ok=True)  # onnx appends to an existing file
        external_data_helper.convert_model_to_external_data(
            model, all_tensors_to_one_file=True, location=data_file.name, size_threshold=EXTERNAL_MIN_BYTES
        )
        onnx.save(model, str(path))
        if data_file.is_file():
            shutil.copymode(path, data_file)  # onnx creates it private (0600); readable like the graph beside it
        if names:
            shared[graph_file] = names
    if shared:
        table.tofile(output_dir / SHARED_EMBEDDING_FILE)
    return shared
