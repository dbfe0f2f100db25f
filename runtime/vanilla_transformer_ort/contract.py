"""The export folder's contract, defined once: file names, the manifest, graph input/output names and the helper
graphs' I/O.

The exporter (`vanilla_transformer.export`) writes folders by these names and this runtime reads them; stdlib only,
so the runtime stays torch-free. Names follow optimum's convention; docs/onnx.md shows every graph's shapes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# Files of an export folder.
ENCODER_FILE = "encoder_model.onnx"
DECODER_FILE = "decoder_model.onnx"
# optional (format version 2): the decoder step whose self-attention cache is a preallocated buffer written in place
INPLACE_DECODER_FILE = "decoder_model_inplace.onnx"
REORDER_FILE = "cache_reorder.onnx"  # helper graph: beam reordering where the cache lives
BEAM_SCORES_FILE = "beam_scores.onnx"  # helper graph: a beam step's log-softmax and top k in onnxruntime
GRAPH_FILES = (ENCODER_FILE, DECODER_FILE, INPLACE_DECODER_FILE, REORDER_FILE, BEAM_SCORES_FILE)
# fp32 folders keep the graphs' weights in ONNX external data: each graph's own in `<graph>.data`, and the embedding
# table that the encoder, the decoders and the output projection share once, in this raw float32 (vocab, d_model)
# file, which every graph's embedding initializer points at (manifest.json's `shared_weights` names them).
SHARED_EMBEDDING_FILE = "shared_embedding.bin"
SHARED_WEIGHTS_KEY = "shared_weights"
MANIFEST_FILE = "manifest.json"
CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
TOKENIZER_FILE = "tokenizer.json"
# A saved tokenizer: `save_pretrained` (transformers 5) writes the first two files; folders saved by older versions
# also hold the special-tokens map, which is copied along where present.
SAVED_TOKENIZER_FILES = (TOKENIZER_FILE, "tokenizer_config.json")
TOKENIZER_FILES = (*SAVED_TOKENIZER_FILES, "special_tokens_map.json")
MANIFEST_FORMAT = "vanilla-transformer-onnx"
# 2 adds decoder_model_inplace.onnx, 3 its per-row `sequence_lengths`; folders of versions 1 and 2 are still read
MANIFEST_FORMAT_VERSION = 3
# The language pair a manifest (or a model folder's training_info.json) names.
SOURCE_LANG, TARGET_LANG = "source_lang", "target_lang"

# Symbolic dimensions of the encoder and decoder graphs.
BATCH_DIM = "batch_size"
SOURCE_DIM = "encoder_sequence_length"
TARGET_DIM = "decoder_sequence_length"
PAST_DIM = "past_sequence_length"

# Encoder graph: ids and mask in; the hidden states, then every decoder layer's cross-attention K/V, out.
INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"  # 1 = token, 0 = padding
LAST_HIDDEN_STATE = "last_hidden_state"
ENCODER_INPUTS = (INPUT_IDS, ATTENTION_MASK)

# Decoder graph: the new tokens, the source mask and the cache in; the logits and the grown self-attention cache out.
ENCODER_ATTENTION_MASK = "encoder_attention_mask"
LOGITS = "logits"
PAST_PREFIX = "past_key_values"
PRESENT_PREFIX = "present"
# The in-place decoder graph's third input: () int32, the past length plus the new tokens (onnxruntime's name).
TOTAL_SEQUENCE_LENGTH = "total_sequence_length"
# Its fourth (format version 3): (rows,) int32, each row's own past length plus the new tokens, so that rows that
# joined the batch at different steps decode side by side; `total_sequence_length` is then their largest.
SEQUENCE_LENGTHS = "sequence_lengths"

# cache_reorder.onnx: `beam_idx` and every past self-attention K/V in, `reordered.{i}.decoder.{key,value}` out.
REORDER_INDEX = "beam_idx"
REORDERED_PREFIX = "reordered"

# beam_scores.onnx: the decoder's logits, the running beam scores (rows, 1), an additive bias (vocab,) and the
# (batch, -1) shape and k, in; the k best `log_softmax(last logits) + bias + running_scores` per sentence out.
BEAM_SCORES_INPUTS = (LOGITS, "running_scores", "bias", "scores_shape", "k")
BEAM_SCORES_OUTPUTS = ("values", "indices")


def external_data_file(graph_file: str) -> str:
    """The side file of a graph's own external weights: `encoder_model.onnx` -> `encoder_model.onnx.data`."""
    return f"{graph_file}.data"


def cache_names(num_layers: int, prefix: str) -> list[str]:
    """Flat KV names in optimum's order: per layer decoder.key, decoder.value, encoder.key, encoder.value."""
    return [
        f"{prefix}.{i}.{part}.{kind}"
        for i in range(num_layers)
        for part in ("decoder", "encoder")
        for kind in ("key", "value")
    ]


def is_self_attention(name: str) -> bool:
    """Whether a cache name is a self-attention key/value (`*.{i}.decoder.*`; the cross-attention ones hold
    `.encoder.`)."""
    return ".decoder." in name


def encoder_output_names(num_layers: int) -> list[str]:
    """`last_hidden_state`, then `present.{i}.encoder.key/value` for every decoder layer."""
    return [LAST_HIDDEN_STATE] + [n for n in cache_names(num_layers, PRESENT_PREFIX) if not is_self_attention(n)]


def decoder_input_names(num_layers: int) -> list[str]:
    """`input_ids`, `encoder_attention_mask`, then all `past_key_values.{i}.{decoder,encoder}.{key,value}`."""
    return [INPUT_IDS, ENCODER_ATTENTION_MASK] + cache_names(num_layers, PAST_PREFIX)


def decoder_output_names(num_layers: int) -> list[str]:
    """`logits`, then `present.{i}.decoder.key/value` (the self-attention cache grown by the new tokens)."""
    return [LOGITS] + [n for n in cache_names(num_layers, PRESENT_PREFIX) if is_self_attention(n)]


def past_name(present: str) -> str:
    """The input a `present.*` output feeds on the next step: `present.{i}.…` -> `past_key_values.{i}.…`."""
    return present.replace(f"{PRESENT_PREFIX}.", f"{PAST_PREFIX}.", 1)


def present_name(past: str) -> str:
    """The output that writes a `past_key_values.*` input's next value: `past_key_values.{i}.…` -> `present.{i}.…`."""
    return past.replace(f"{PAST_PREFIX}.", f"{PRESENT_PREFIX}.", 1)


def reordered_name(past: str) -> str:
    """`cache_reorder.onnx`'s output for a cache input: `past_key_values.{i}.…` -> `reordered.{i}.…`."""
    return past.replace(f"{PAST_PREFIX}.", f"{REORDERED_PREFIX}.", 1)


# What an error about an incomplete or unreadable export folder tells the user to do.
EXPORT_AGAIN = "export the model again: vt-export-onnx --model MODEL_FOLDER --output EXPORT_FOLDER"


def read_json_object(path: str | os.PathLike, optional: bool = False) -> dict:
    """A JSON file of an export folder that must hold an object (manifest, config, generation config); with
    `optional`, {} where the file does not exist.

    Raises ValueError (one line, naming the file) when it does not parse or holds something else, OSError when it
    cannot be read.
    """
    if optional and not Path(path).is_file():
        return {}
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{path} is not valid JSON ({error}); {EXPORT_AGAIN}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path} holds a JSON {type(value).__name__}, not an object; {EXPORT_AGAIN}")
    return value


def read_manifest(folder: str | os.PathLike) -> dict:
    """The folder's `manifest.json` (the one place it is read), or {} where the folder has none."""
    return read_json_object(Path(folder) / MANIFEST_FILE, optional=True)


def language_pair(info: dict) -> tuple[str, str] | None:
    """(source, target) language codes of a manifest or a `training_info.json`; None unless it names both."""
    if isinstance(info, dict) and info.get(SOURCE_LANG) and info.get(TARGET_LANG):
        return str(info[SOURCE_LANG]), str(info[TARGET_LANG])
    return None
