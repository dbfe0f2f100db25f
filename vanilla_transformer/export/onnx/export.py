"""The export folder: graphs, helper graphs, tokenizer, configs and a manifest, written by `export_model`.

Validation against PyTorch is a separate step (`validation.validate_folder`) that callers run after
`export_model`; this module does not import it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from vanilla_transformer_ort.contract import (
    DECODER_FILE,
    GRAPH_FILES,
    INPLACE_DECODER_FILE,
    MANIFEST_FILE,
    MANIFEST_FORMAT,
    MANIFEST_FORMAT_VERSION,
    SHARED_EMBEDDING_FILE,
    SHARED_WEIGHTS_KEY,
    TOKENIZER_FILE,
    TOKENIZER_FILES,
    external_data_file,
)

from ...cli_parsers import check_model_folder
from .graphs import DEFAULT_OPSET, export_graphs
from .helper_graphs import write_beam_scores_graph, write_cache_reorder_graph
from .inplace_decoder import export_inplace_decoder
from .variants import optimize_variant
from .weights import store_weights_externally


def _graph_io(path: Path) -> dict:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph

    def describe(values) -> list[dict]:
        rows = []
        for value in values:
            tensor = value.type.tensor_type
            dims = [d.dim_param or d.dim_value for d in tensor.shape.dim]
            rows.append({"name": value.name, "dtype": onnx.TensorProto.DataType.Name(tensor.elem_type), "shape": dims})
        return rows

    return {"inputs": describe(graph.input), "outputs": describe(graph.output)}


def copy_tokenizer(tokenizer_dir: Path, output_dir: Path) -> None:
    """Copy `tokenizer.json` and its side files, or Marian's sentencepiece files (a model converted from Marian);
    raises ValueError when there is no tokenizer."""
    from vanilla_transformer_ort.marian_tokenizer import MARIAN_TOKENIZER_FILES, is_marian_tokenizer_folder

    names = TOKENIZER_FILES
    if not (tokenizer_dir / TOKENIZER_FILE).is_file():
        if not is_marian_tokenizer_folder(tokenizer_dir):
            raise ValueError(f"No tokenizer.json in {tokenizer_dir}: the export folder needs the tokenizer to run.")
        names = MARIAN_TOKENIZER_FILES + ("special_tokens_map.json",)
    for name in names:
        if (tokenizer_dir / name).is_file():
            shutil.copy2(tokenizer_dir / name, output_dir / name)


def export_model(
    model_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    dtype: str = "fp32",
    quantize: str | None = None,
    opset: int = DEFAULT_OPSET,
    tokenizer_dir: str | os.PathLike | None = None,
    decoder_cache: str = "inplace",
    int8_activations: str = "row",
) -> dict:
    """Export a saved model folder into a self-contained ONNX folder; returns the manifest written with it.

    To compare the folder with PyTorch, run `validation.validate_folder(model_dir, output_dir)` afterwards.

    Args:
        model_dir: a `save_pretrained` folder of `VanillaTransformerForConditionalGeneration`.
        output_dir: created if needed; receives the encoder and decoder graphs, the helper graphs, config,
            generation config, tokenizer and manifest.
        dtype: "fp32" or "fp16" (fp16 weights, activations and KV cache; for GPU serving).
        quantize: None or "int8" (dynamic quantization of the fp32 graphs, CPU serving).
        opset: ONNX opset for the exporter.
        tokenizer_dir: where `tokenizer.json` lives; defaults to `model_dir`.
        decoder_cache: "inplace" (fp32 and int8 folders) also writes `decoder_model_inplace.onnx`, the decoder step
            whose cache is written in place, which the runtime runs on CPU; "copy" writes only the copying decoder
            (`decoder_model.onnx`, always written: validation, CUDA and older runtimes use it). fp16 folders are for
            CUDA and have only the copying decoder.
        int8_activations: with quantize="int8", "row" (the default) quantizes each row (token) of a MatMul's input
            with its own scale, so a sentence's translation does not depend on the batch it is decoded in (the
            server batches requests together); "tensor" keeps onnxruntime's one scale per tensor.
    """
    if dtype not in ("fp32", "fp16"):
        raise ValueError(f"dtype must be 'fp32' or 'fp16', got {dtype!r}")
    if quantize not in (None, "int8"):
        raise ValueError(f"quantize must be None or 'int8', got {quantize!r}")
    if dtype == "fp16" and quantize:
        raise ValueError("int8 quantization applies to fp32 graphs; do not combine it with dtype='fp16'")
    if int8_activations not in ("row", "tensor"):
        raise ValueError(f"int8_activations must be 'row' or 'tensor', got {int8_activations!r}")
    if decoder_cache not in ("inplace", "copy"):
        raise ValueError(f"decoder_cache must be 'inplace' or 'copy', got {decoder_cache!r}")
    model_dir, output_dir = Path(model_dir), Path(output_dir)
    check_model_folder(str(model_dir), must_exist=True)
    output_dir.mkdir(parents=True, exist_ok=True)
    copy_tokenizer(Path(tokenizer_dir) if tokenizer_dir else model_dir, output_dir)

    from ...inference import load_model_folder

    model = load_model_folder(model_dir, dtype=torch.float32).eval()
    export_graphs(model, output_dir, opset=opset)
    inplace = decoder_cache == "inplace" and dtype == "fp32"
    (output_dir / INPLACE_DECODER_FILE).unlink(missing_ok=True)  # a re-export into an older folder
    for stale in (SHARED_EMBEDDING_FILE, *(external_data_file(name) for name in GRAPH_FILES)):
        (output_dir / stale).unlink(missing_ok=True)  # a re-export into a folder of another dtype
    if inplace:
        export_inplace_decoder(model, output_dir, tie_output_projection=not quantize)
    if dtype != "fp32" or quantize:
        optimize_variant(output_dir, dtype, quantize, inplace=inplace, int8_activations=int8_activations)
    shared_weights = {}
    if dtype == "fp32" and not quantize:
        table = model.get_input_embeddings().weight.detach().float().numpy()
        shared_weights = store_weights_externally(output_dir, table)
    write_cache_reorder_graph(output_dir)
    write_beam_scores_graph(output_dir)
    model.config.save_pretrained(output_dir)
    model.generation_config.save_pretrained(output_dir)
    quantization = {"row": "int8-dynamic-per-row", "tensor": "int8-dynamic"}[int8_activations] if quantize else None
    manifest = build_manifest(model.config, output_dir, dtype=dtype, quantization=quantization, opset=opset)
    if shared_weights:
        spec = {"file": SHARED_EMBEDDING_FILE, "dtype": "float32", "shape": list(table.shape)}
        manifest[SHARED_WEIGHTS_KEY] = {**spec, "initializers": shared_weights}
    manifest.update(_languages(model_dir))
    (output_dir / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _languages(model_dir: Path) -> dict:
    """`source_lang` and `target_lang` from the model's `training_info.json` (written by training), if it names them:
    the translation server reads them to know which pair a folder serves."""
    path = model_dir / "training_info.json"
    if not path.is_file():
        return {}
    info = json.loads(path.read_text(encoding="utf-8"))
    return {key: info[key] for key in ("source_lang", "target_lang") if info.get(key)}


def build_manifest(config, output_dir: Path, *, dtype: str, quantization: str | None, opset: int) -> dict:
    """What was exported: format, opset, dtype, dimensions the runtime needs, graph I/O and file sizes."""
    import onnx

    files = {p.name: p.stat().st_size for p in sorted(output_dir.iterdir()) if p.is_file() and p.name != MANIFEST_FILE}
    return {
        "format": MANIFEST_FORMAT,
        "format_version": MANIFEST_FORMAT_VERSION,
        "opset": opset,
        "ir_version": onnx.load(str(output_dir / DECODER_FILE), load_external_data=False).ir_version,
        "dtype": dtype,
        "quantization": quantization,  # None, "int8-dynamic-per-row" or "int8-dynamic" (one scale per tensor)
        # the decoder the runtime runs on CPU: "inplace" (decoder_model_inplace.onnx) or "copy" (decoder_model.onnx)
        "decoder_cache": "inplace" if (output_dir / INPLACE_DECODER_FILE).is_file() else "copy",
        "decoder_layers": config.decoder_layers,
        "decoder_attention_heads": config.decoder_attention_heads,
        "d_model": config.d_model,
        "vocab_size": config.vocab_size,
        "graphs": {name: _graph_io(output_dir / name) for name in GRAPH_FILES if (output_dir / name).is_file()},
        "files": files,
    }
