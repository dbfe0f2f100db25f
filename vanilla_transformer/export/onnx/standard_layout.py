"""The standard ONNX layout that 🤗 Optimum (`ORTModelForSeq2SeqLM`) and transformers.js read, written by
`export_standard_layout`:

    OUT/config.json, model.safetensors, generation_config.json, tokenizer.json, tokenizer_config.json
        (a complete MarianMT folder, written by `marian_export.save_marian`)
    OUT/onnx/encoder_model.onnx, onnx/decoder_model_merged.onnx
    OUT/onnx/encoder_model_quantized.onnx, onnx/decoder_model_merged_quantized.onnx  (with quantize="int8")

Graphs and names: `merged_decoder`; what each consumer reads and when to use which layout:
docs/onnx-standard-layout.md. Weights stay inside each .onnx file (no external data), so a file holds at most 2 GB.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from vanilla_transformer_ort.contract import CONFIG_FILE, TOKENIZER_FILE
from vanilla_transformer_ort.layouts import (
    OPTIMUM,
    PYTORCH,
    STANDARD_DECODER_FILE,
    STANDARD_ENCODER_FILE,
    STANDARD_SUBFOLDER,
    check_layout,
)

from ..output_folder import check_output_dir, staged_output
from .graphs import DEFAULT_OPSET

QUANTIZED_SUFFIX = "_quantized"  # transformers.js's name for a dynamic int8 graph: encoder_model_quantized.onnx
QUANTIZATIONS = ("int8",)
# protobuf cannot serialise a message of 2 GiB or more, so no .onnx file with its weights inside can reach it.
MAX_GRAPH_BYTES = 2**31 - 1
# What a graph holds besides its weights (nodes, names, shapes): kept free below the limit.
GRAPH_OVERHEAD_BYTES = 16 * 2**20


def quantized_name(graph_file: str) -> str:
    """`encoder_model.onnx` -> `encoder_model_quantized.onnx`."""
    return graph_file.replace(".onnx", f"{QUANTIZED_SUFFIX}.onnx")


def standard_layout_files(folder: str | os.PathLike, quantized: bool = False) -> dict[str, Path]:
    """The graphs of a standard-layout folder: {"encoder": path, "decoder": path} (the `_quantized` ones with
    `quantized=True`). Raises ValueError naming the folder's layout and the command that writes the standard one when
    `folder` is another kind of folder, or naming the missing file."""
    folder = Path(folder)
    check_layout(folder, OPTIMUM)
    files = {"encoder": STANDARD_ENCODER_FILE, "decoder": STANDARD_DECODER_FILE}
    paths = {}
    for role, name in files.items():
        name = quantized_name(name) if quantized else name
        path = folder / STANDARD_SUBFOLDER / name
        if not path.is_file():
            option = " --quantize int8" if quantized else ""
            raise ValueError(f"{folder} has no {STANDARD_SUBFOLDER}/{name}; export it with `vt-export-onnx --layout "
                             f"optimum{option} --model MODEL --output OUT`")  # fmt: skip
        paths[role] = path
    return paths


def check_exportable(model: torch.nn.Module, limit: int = MAX_GRAPH_BYTES) -> None:
    """Raise ValueError when a graph of the model, weights inside, would not fit in one .onnx file (`limit` bytes).

    The encoder graph holds the encoder and the (source) embedding; the decoder graph every other weight.
    """
    encoder_ids = {id(p) for p in model.model.encoder.parameters()}
    sizes = {"encoder": 0, "decoder": 0}
    for parameter in {id(p): p for p in model.parameters()}.values():  # a tied table counted once per graph
        nbytes = parameter.numel() * 4  # fp32
        sizes["encoder" if id(parameter) in encoder_ids else "decoder"] += nbytes
    embedding = model.get_input_embeddings().weight
    if id(embedding) in encoder_ids:  # shared with the decoder, whose graph holds its own copy
        sizes["decoder"] += embedding.numel() * 4
    for graph, size in sizes.items():
        if size + GRAPH_OVERHEAD_BYTES > limit:
            raise ValueError(
                f"the {graph} graph would hold {size / 2**30:.2f} GiB of fp32 weights; the standard layout keeps "
                f"weights inside each .onnx file, which cannot exceed 2 GB: use the vanilla layout (external weights)"
            )


def find_tokenizer(model_dir: Path, tokenizer_dir: Path | None) -> Path:
    """The folder whose `tokenizer.json` the standard layout ships; ValueError when it has none."""
    folder = tokenizer_dir or model_dir
    if not (folder / TOKENIZER_FILE).is_file():
        hint = "" if tokenizer_dir else "; pass --tokenizer FOLDER"
        raise ValueError(f"no {TOKENIZER_FILE} in {folder}: the standard layout ships it (transformers.js and Optimum "
                         f"read it){hint}")  # fmt: skip
    return folder


def check_marian_compatible(model_dir: Path) -> None:
    """Raise ValueError, before any weight is loaded, for a model that MarianMT's config.json cannot describe
    (pre-LN, an activation or LayerNorm ε Marian lacks, another model type): the standard layout ships that config."""
    from ...marian.exporter import marian_config_from
    from ...model.configuration_vanilla_transformer import VanillaTransformerConfig

    model_type = json.loads((model_dir / CONFIG_FILE).read_text(encoding="utf-8")).get("model_type")
    if model_type != VanillaTransformerConfig.model_type:
        raise ValueError(f"{model_dir} holds a {model_type!r} model, not a {VanillaTransformerConfig.model_type} one")
    try:
        marian_config_from(VanillaTransformerConfig.from_pretrained(model_dir))
    except ValueError as error:
        raise ValueError(f"{model_dir}: {error} The standard layout's config.json is MarianMT's; the vanilla layout "
                         "(--layout vanilla) has no such limit.") from None  # fmt: skip


def quantize_graph(path: Path, output: Path, is_decoder: bool) -> None:
    """Dynamic int8 (onnxruntime.quantization.quantize_dynamic, QInt8 weights, activations quantized per call) of
    one graph into `output`. The decoder's output projection first gets a pre-transposed weight of its own, or int8
    would dequantize the whole tied table on every step. The cross K/V projections inside the
    If's else branch (run once per sentence) stay fp32."""
    from .variants import quantize_int8, untie_output_projection

    shutil.copy2(path, output)
    if is_decoder:
        untie_output_projection(output)
    quantize_int8(output)


def export_standard_layout(
    model_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    quantize: str | None = None,
    tokenizer_dir: str | os.PathLike | None = None,
    overwrite: bool = False,
    opset: int = DEFAULT_OPSET,
) -> Path:
    """Export a saved model folder in the standard layout of Optimum and transformers.js; returns `output_dir`.

    The folder is assembled in a temporary folder beside `output_dir` and renamed into place at the end, so a failed
    export leaves nothing behind (and an existing `output_dir`, with `overwrite`, untouched until then).

    Args:
        model_dir: a `save_pretrained` folder of `VanillaTransformerForConditionalGeneration` (post-LN).
        output_dir: the folder to write; refused when it exists and is not empty, unless `overwrite`.
        quantize: None or "int8": also write `onnx/*_quantized.onnx`, dynamic int8 versions of both graphs.
        tokenizer_dir: where `tokenizer.json` lives; defaults to `model_dir`.
        overwrite: replace a non-empty `output_dir`.
        opset: ONNX opset of both graphs.
    Raises:
        ValueError: a bad argument, a folder that is not a PyTorch model folder (naming what it is), a model without
            tokenizer.json, a model MarianMT's config cannot describe (pre-LN, ...) or a graph over 2 GB.
    """
    if quantize not in (None, *QUANTIZATIONS):
        raise ValueError(f"quantize must be None or one of {QUANTIZATIONS}, got {quantize!r}")
    model_dir, output_dir = Path(model_dir), Path(output_dir)
    if not model_dir.is_dir():
        raise ValueError(f"--model {model_dir} does not exist")
    check_layout(model_dir, PYTORCH)
    if not (model_dir / CONFIG_FILE).is_file():
        raise ValueError(f"{model_dir} is not a saved model folder (no config.json)")
    check_output_dir(output_dir, overwrite)
    tokenizer_dir = find_tokenizer(model_dir, Path(tokenizer_dir) if tokenizer_dir else None)
    check_marian_compatible(model_dir)

    from ...inference import load_model_folder
    from ...marian.exporter import save_marian
    from .merged_decoder import build_merged_decoder, export_encoder

    model = load_model_folder(model_dir, dtype=torch.float32).eval()
    check_exportable(model)
    with staged_output(output_dir) as stage:
        # config.json, model.safetensors (MarianMT's weights: the folder is a complete MarianMT model too),
        # generation_config.json and the tokenizer
        save_marian(model, stage, tokenizer_dir=tokenizer_dir)
        graphs = stage / STANDARD_SUBFOLDER
        graphs.mkdir()
        attn_implementation = model.config._attn_implementation
        model.set_attn_implementation("eager")  # fuses into onnxruntime's FusedMatMul (see graphs.py)
        try:
            export_encoder(model, graphs / STANDARD_ENCODER_FILE, opset)
            _save(build_merged_decoder(model, stage.parent, opset), graphs / STANDARD_DECODER_FILE)
        finally:
            model.set_attn_implementation(attn_implementation)
        if quantize == "int8":
            for name in (STANDARD_ENCODER_FILE, STANDARD_DECODER_FILE):
                quantize_graph(graphs / name, graphs / quantized_name(name), is_decoder=name == STANDARD_DECODER_FILE)
    return output_dir


def _save(model, path: Path) -> None:
    import onnx

    if model.ByteSize() >= MAX_GRAPH_BYTES:  # check_exportable's estimate missed: never write a broken file
        raise ValueError(f"{path.name} would be {model.ByteSize() / 2**30:.2f} GiB, over the 2 GB of one .onnx file")
    onnx.save(model, str(path))
