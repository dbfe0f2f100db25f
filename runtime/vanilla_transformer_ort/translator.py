"""`OrtTranslator`: load an exported folder with onnxruntime and translate (numpy + tokenizers only, no torch).

Graph names and shapes: `contract.py` and docs/onnx.md. The encoder runs once per batch and hands every decoder
layer's cross-attention K/V to the decoder; the decoder graph runs once per generated token. The folder itself is
read and checked by `folder.ExportFolder`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence
from dataclasses import fields

import numpy as np

from .contract import (
    ATTENTION_MASK,
    BEAM_SCORES_FILE,
    DECODER_FILE,
    ENCODER_FILE,
    INPLACE_DECODER_FILE,
    INPUT_IDS,
    LAST_HIDDEN_STATE,
    PAST_PREFIX,
    REORDER_FILE,
    cache_names,
    is_self_attention,
    past_name,
)
from .decoder_state import BoundState, InPlaceState, NumpyState
from .folder import ExportFolder, settings_from_folder  # noqa: F401 (settings_from_folder: re-exported)
from .search import DecoderState, GenerationSettings, beam_search, greedy_search
from .sessions import PROVIDERS, create_session, resolve_provider, session_options, shared_table

logger = logging.getLogger(__name__)


def target_vocab_size(config: dict) -> int:
    """Rows of the logits: the decoder's vocabulary (`decoder_vocab_size` when the embeddings are not shared)."""
    if config.get("share_encoder_decoder_embeddings", True) or not config.get("decoder_vocab_size"):
        return config["vocab_size"]
    return config["decoder_vocab_size"]


def check_token_array(name: str, array: np.ndarray) -> np.ndarray:
    """Integer array of rank 2 -> int64; raises ValueError naming the problem otherwise."""
    array = np.asarray(array)
    if array.ndim != 2:
        raise ValueError(f"{name} must have rank 2 (batch, sequence), got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.integer) and array.dtype != np.bool_:
        raise ValueError(f"{name} must be an integer array, got dtype {array.dtype}")
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"{name} must be non-empty, got shape {array.shape}")
    return array.astype(np.int64, copy=False)


def check_texts(texts) -> None:
    """`texts` must be a non-empty list (or tuple) of str; errors name the offending item."""
    if isinstance(texts, str):
        raise ValueError("texts must be a list of strings, got a single str: pass [text]")
    if not isinstance(texts, (list, tuple)):
        raise TypeError(f"texts must be a list of strings, got {type(texts).__name__}")
    if not texts:
        raise ValueError("texts is empty: pass at least one string")
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts[{index}] must be a str, got {type(text).__name__} {text!r:.40}")


class OrtTranslator:
    """Translate with an exported folder (see `vanilla_transformer.export.onnx.export.export_model`) on onnxruntime.

    Args:
        folder: export folder (a path, or an `ExportFolder` already read) with `encoder_model.onnx`,
            `decoder_model.onnx`, `config.json`, `manifest.json` and `tokenizer.json` (or Marian's `source.spm`,
            `target.spm`, `vocab.json`).
        provider: "auto" (CUDA when onnxruntime-gpu and a GPU are present, else CPU), "cpu" or "cuda".
        intra_op_num_threads: threads per operator; set it explicitly on shared machines.
        use_io_binding: keep the KV cache in onnxruntime values between steps; defaults to True on CUDA.
        enable_cpu_mem_arena: with `shared_cpu_arena=False`, give each session onnxruntime's own CPU memory arena
            (off by default: the intermediates are freed after each run).
        shared_cpu_arena: on the CPU provider, every session of the process (of every OrtTranslator) allocates from
            one onnxruntime arena (`sessions.register_shared_cpu_arena`): the lowest peak memory measured, same
            tokens and speed. False falls back to `enable_cpu_mem_arena`.
        session_config: extra onnxruntime session config entries, e.g. `{"session.intra_op.allow_spinning": "0"}`.
        disabled_optimizers: onnxruntime graph fusions to skip; by default `CPU_DISABLED_OPTIMIZERS` on the CPU
            provider (slower fused kernels, see `create_session`) and none on CUDA; `()` keeps them all.
        decoder_cache: "inplace" runs `decoder_model_inplace.onnx`, whose self-attention cache is a preallocated
            buffer written in place and whose cross-attention keys/values are held once per source (not per beam);
            "copy" runs `decoder_model.onnx`, which returns the grown cache every step. "auto" (the default) takes
            the in-place graph on the CPU provider where the folder has it (export format version 2), else "copy".
    """

    # Positions the in-place decoder's cache buffers hold at first (capped at the generation's maximum length); they
    # double when a longer output needs it.
    INITIAL_CACHE_CAPACITY = 32

    def __init__(
        self,
        folder: str | os.PathLike | ExportFolder,
        provider: str = "auto",
        intra_op_num_threads: int = 1,
        use_io_binding: bool | None = None,
        enable_cpu_mem_arena: bool = False,
        shared_cpu_arena: bool = True,
        session_config: dict[str, str] | None = None,
        disabled_optimizers: Sequence[str] | None = None,
        decoder_cache: str = "auto",
    ):
        self.export_folder = ExportFolder.of(folder)
        self.folder = self.export_folder.path
        self.manifest = self.export_folder.manifest
        self.config = self.export_folder.config
        self.settings = dataclasses.replace(self.export_folder.settings)  # this translator's own copy
        self.tokenizer = self.export_folder.tokenizer
        requested = resolve_provider(provider)
        providers = [requested] if requested == PROVIDERS["cpu"] else [requested, PROVIDERS["cpu"]]
        # fp32 folders store the shared embedding once; on CPU every session reads one buffer of it (elsewhere
        # onnxruntime reads the file itself, for the device).
        table, table_names = shared_table(self.folder, self.manifest) if requested == PROVIDERS["cpu"] else (None, {})

        def session(name: str):
            options = session_options(
                intra_op_num_threads, enable_cpu_mem_arena, session_config,
                shared_cpu_arena=shared_cpu_arena and requested == PROVIDERS["cpu"],
            )  # fmt: skip
            for initializer in table_names.get(name, ()):
                options.add_initializer(initializer, table)
            return create_session(self.folder / name, options, providers, disabled_optimizers)

        self.encoder = session(ENCODER_FILE)
        self.inplace = self._use_inplace(decoder_cache, requested, use_io_binding)
        self.decoder = session(INPLACE_DECODER_FILE if self.inplace else DECODER_FILE)
        self.reorder = session(REORDER_FILE)  # the I/O binding path's beam reordering
        self.beam_scores = session(BEAM_SCORES_FILE)
        # onnxruntime-gpu lists CUDA even without a GPU and silently falls back to CPU: report what is used.
        self.provider = self.decoder.get_providers()[0]
        if requested != self.provider:
            logger.warning("Requested %s, onnxruntime uses %s", requested, self.provider)
        self.device = "cuda" if self.provider == PROVIDERS["cuda"] else "cpu"
        self.use_io_binding = self.device == "cuda" if use_io_binding is None else use_io_binding
        self.num_layers = self.config["decoder_layers"]
        self.num_heads = self.config["decoder_attention_heads"]
        self.d_head = self.config["d_model"] // self.num_heads
        cache_input = next(i for i in self.decoder.get_inputs() if i.name.startswith(PAST_PREFIX))
        self.cache_dtype = np.float16 if cache_input.type == "tensor(float16)" else np.float32

    def _use_inplace(self, decoder_cache: str, provider: str, use_io_binding: bool | None) -> bool:
        """Whether to run the in-place decoder graph (see `decoder_cache` in the class docstring)."""
        if decoder_cache not in ("auto", "inplace", "copy"):
            raise ValueError(f"decoder_cache must be 'auto', 'inplace' or 'copy', got {decoder_cache!r}")
        available = self.export_folder.has(INPLACE_DECODER_FILE)
        if decoder_cache == "inplace" and not available:
            raise ValueError(
                f"Export folder {self.folder} has no {INPLACE_DECODER_FILE} (exported before format version 2, or "
                "as fp16): re-export it, or use decoder_cache='copy'"
            )
        # Its attention operators run on CPU in fp32; on CUDA the copying graph keeps the cache on the device.
        return decoder_cache == "inplace" or (
            decoder_cache == "auto" and available and provider == PROVIDERS["cpu"] and not use_io_binding
        )

    # -- token level ------------------------------------------------------------------------------------------

    def generate(self, input_ids: np.ndarray, attention_mask: np.ndarray | None = None, **overrides) -> np.ndarray:
        """Token ids in, token ids out, like `model.generate(input_ids, attention_mask, ...)`.

        Args:
            input_ids: (batch, src_len) integer source ids, right- or left-padded.
            attention_mask: (batch, src_len), 1 = token, 0 = padding; all ones when omitted.
            overrides: any `GenerationSettings` field (`max_new_tokens`, `num_beams`, `length_penalty`, ...).
        Returns:
            (batch, 1 + generated) int64, starting with the decoder start token; finished rows are filled like
            transformers fills them (pad for greedy, `pad_token_id or eos_token_id` for beam search).
        """
        input_ids = check_token_array("input_ids", input_ids)
        if attention_mask is None:
            attention_mask = np.ones_like(input_ids)
        attention_mask = check_token_array("attention_mask", attention_mask)
        if attention_mask.shape != input_ids.shape:
            raise ValueError(f"attention_mask shape {attention_mask.shape} != input_ids shape {input_ids.shape}")
        vocab_size = self.config["vocab_size"]
        if input_ids.min() < 0 or input_ids.max() >= vocab_size:
            raise ValueError(f"input_ids holds ids outside the vocabulary [0, {vocab_size})")
        settings = self._settings(overrides)
        batch = input_ids.shape[0]
        state = self._start(input_ids, attention_mask, settings.num_beams, settings.max_new_tokens + 1)
        if settings.num_beams == 1:
            return greedy_search(state, batch, settings)
        return beam_search(state, batch, settings)

    def _settings(self, overrides: dict) -> GenerationSettings:
        known = {f.name for f in fields(GenerationSettings)}
        unknown = set(overrides) - known
        if unknown:
            raise ValueError(f"Unknown generation options {sorted(unknown)}; known: {sorted(known)}")
        values = {f.name: getattr(self.settings, f.name) for f in fields(GenerationSettings)}
        values.update({k: v for k, v in overrides.items() if v is not None})
        settings = GenerationSettings(**values)
        settings.validate()
        return settings

    def _start(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, num_beams: int, max_length: int
    ) -> DecoderState:
        """Run the encoder once; every beam of a sentence shares its cross-attention K/V."""
        names = [o.name for o in self.encoder.get_outputs()]
        outputs = dict(
            zip(names, self.encoder.run(None, {INPUT_IDS: input_ids, ATTENTION_MASK: attention_mask}), strict=True)
        )
        vocab_size = target_vocab_size(self.config)
        if self.inplace:  # one copy of the cross-attention K/V and the mask per source, read by all its beams
            cross = {past_name(name): value for name, value in outputs.items() if name != LAST_HIDDEN_STATE}
            return InPlaceState(
                self.decoder, cross, attention_mask, num_beams, self.num_heads, self.d_head, vocab_size,
                self.beam_scores, capacity=min(self.INITIAL_CACHE_CAPACITY, max_length), max_capacity=max_length,
            )  # fmt: skip
        cross = {
            past_name(name): np.repeat(value, num_beams, axis=0)
            for name, value in outputs.items()
            if name != LAST_HIDDEN_STATE
        }
        mask = np.repeat(attention_mask, num_beams, axis=0)
        rows = input_ids.shape[0] * num_beams
        empty = np.zeros((rows, self.num_heads, 0, self.d_head), dtype=self.cache_dtype)
        past = {name: empty for name in cache_names(self.num_layers, PAST_PREFIX) if is_self_attention(name)}
        if self.use_io_binding:
            return BoundState(self.decoder, cross, mask, past, self.device, vocab_size, self.reorder, self.beam_scores)
        return NumpyState(self.decoder, cross, mask, past, vocab_size, self.beam_scores)

    # -- text level -------------------------------------------------------------------------------------------

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Tokenize and right-pad a batch: (input_ids, attention_mask), both (batch, longest) int64."""
        check_texts(texts)
        encodings = self.tokenizer.encode_batch(texts)
        longest = max(len(e.ids) for e in encodings)
        pad = self.settings.pad_token_id or 0
        input_ids = np.full((len(texts), longest), pad, dtype=np.int64)
        attention_mask = np.zeros((len(texts), longest), dtype=np.int64)
        for row, encoding in enumerate(encodings):
            input_ids[row, : len(encoding.ids)] = encoding.ids
            attention_mask[row, : len(encoding.ids)] = 1
        return input_ids, attention_mask

    def translate(self, texts: list[str], **overrides) -> list[str]:
        """Text in, text out; `overrides` as in `generate`."""
        input_ids, attention_mask = self.encode(texts)
        output = self.generate(input_ids, attention_mask, **overrides)
        return self.tokenizer.decode_batch(output.tolist(), skip_special_tokens=True)
