"""`OrtTranslator`: load an exported folder with onnxruntime and translate (numpy + tokenizers only, no torch).

Folders converted from Marian carry Marian's sentencepiece tokenizer instead of `tokenizer.json`; they need the
`sentencepiece` package (see `marian_tokenizer.py`).

Graph names and shapes: export/README.md. The encoder runs once per batch and hands every decoder layer's
cross-attention K/V to the decoder; the decoder graph runs once per generated token.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

import numpy as np

from .marian_tokenizer import MarianSentencePieceTokenizer, is_marian_tokenizer_folder
from .search import DecoderState, GenerationSettings, beam_search, greedy_search

logger = logging.getLogger(__name__)

ENCODER_FILE = "encoder_model.onnx"
DECODER_FILE = "decoder_model.onnx"
REORDER_FILE = "cache_reorder.onnx"  # optional helper graph: beam reordering on the device
BEAM_SCORES_FILE = "beam_scores.onnx"  # optional helper graph: a beam step's log-softmax and top k in onnxruntime
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
# onnxruntime session config entries set by default (see `session_options`).
DEFAULT_SESSION_CONFIG = {"session.force_spinning_stop": "1"}
# onnxruntime graph fusions skipped on the CPU provider (see `create_session`): their fused kernels are slower here.
CPU_DISABLED_OPTIMIZERS = ("SkipLayerNormFusion", "MatMulScaleFusion")
# Generation options that change outputs but are not implemented here: refuse them instead of ignoring them.
UNSUPPORTED_GENERATION = {
    "do_sample": False,
    "num_return_sequences": 1,
    "repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "forced_bos_token_id": None,
    "num_beam_groups": 1,
    "diversity_penalty": 0.0,
}


def resolve_provider(provider: str) -> str:
    """'auto', 'cpu', 'cuda' (or a full EP name) -> the execution provider to ask for."""
    import onnxruntime as ort

    aliases = {**PROVIDERS, **{v.lower(): v for v in PROVIDERS.values()}}
    available = ort.get_available_providers()
    key = provider.lower()
    if key == "auto":
        return PROVIDERS["cuda"] if PROVIDERS["cuda"] in available else PROVIDERS["cpu"]
    if key not in aliases:
        raise ValueError(f"Unknown provider {provider!r}: expected 'auto', 'cpu' or 'cuda'")
    name = aliases[key]
    if name not in available:
        raise ValueError(
            f"Provider {provider!r} is not available in this onnxruntime build (available: {available}); "
            "for CUDA install the package's `gpu` extra (onnxruntime-gpu) in an environment without onnxruntime"
        )
    return name


def session_options(
    intra_op_num_threads: int, enable_cpu_mem_arena: bool = False, config_entries: dict[str, str] | None = None
):
    """Explicit threads (the default spins on every core), all graph optimizations (less two CPU fusions, see
    `create_session`), the CPU arena off, and threads that stop spinning when a run ends.

    Without the arena, onnxruntime frees intermediate tensors instead of keeping the largest size it ever needed:
    beam 4 at batch 16 on the base int8 export peaks 57 MB (13%) lower, at the same speed within noise.
    onnxruntime's worker threads spin between the operators of a run (kept: it is faster) and, by default, for a
    while after it. After the encoder's run that spinning took a core from the first decoder steps: stopping it
    (`session.force_spinning_stop`) took greedy batch 1 at base size from 82-113 to 59-66 ms (int8) and from 213 to
    165-175 ms (fp32). `config_entries` are passed to `SessionOptions.add_session_config_entry` and override these
    defaults, e.g. `{"session.intra_op.allow_spinning": "0"}` on a machine shared with other jobs.
    """
    import onnxruntime as ort

    if intra_op_num_threads < 1:
        raise ValueError(f"intra_op_num_threads must be >= 1, got {intra_op_num_threads}")
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_num_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_cpu_mem_arena = enable_cpu_mem_arena
    entries = {**DEFAULT_SESSION_CONFIG, **(config_entries or {})}
    for key, value in entries.items():
        options.add_session_config_entry(key, str(value))
    return options


def create_session(
    path: str | os.PathLike, options, providers: list[str], disabled_optimizers: Sequence[str] | None = None
):
    """An `onnxruntime.InferenceSession` for `path`, without the graph fusions that are slower on CPU.

    `disabled_optimizers=None` skips `CPU_DISABLED_OPTIMIZERS` when the first provider is the CPU one and nothing
    otherwise; `()` keeps every fusion. On CPU (onnxruntime 1.32, 2 threads, base size, a decoder step at 64 rows):
    - `SkipLayerNormFusion` merges each residual `Add` with the `LayerNormalization` after it into one
      `SkipLayerNormalization`, and that kernel is 3-4x slower than the two operators it replaces
      (64x512: 107-170 us against 29-41 us); 18 of them took 1.64 ms of the int8 step, against 0.6 ms unfused.
    - `MatMulScaleFusion` folds the attention scale 1/sqrt(d_k) into the `FusedMatMul` of Q and K^T, and a
      `FusedMatMul` with a scale other than 1 runs twice as slow: 2.37 ms against 1.15 ms plus 0.15 ms for the `Mul`.
    Together: int8 beam 4 at batch 16 681 to 616 ms, fp32 1376 to 1295 ms; greedy batch 1 unchanged. The unfused
    operators also compute like PyTorch (residual add, then layer norm; scores, then scale).
    """
    import onnxruntime as ort

    if isinstance(disabled_optimizers, str):  # list("SkipLayerNormFusion") would pass onnxruntime's check unnoticed
        raise ValueError(
            f"disabled_optimizers must be a sequence of fusion names, got the string {disabled_optimizers!r}"
        )
    if disabled_optimizers is None:
        disabled_optimizers = CPU_DISABLED_OPTIMIZERS if providers[0] == PROVIDERS["cpu"] else ()
    return ort.InferenceSession(str(path), options, providers=providers, disabled_optimizers=list(disabled_optimizers))


def settings_from_folder(folder: Path) -> GenerationSettings:
    """Generation defaults from `generation_config.json` and `config.json`, as transformers resolves them."""
    config = json.loads((folder / "config.json").read_text())
    generation = {}
    if (folder / "generation_config.json").is_file():
        generation = json.loads((folder / "generation_config.json").read_text())
    for key, default in UNSUPPORTED_GENERATION.items():
        if generation.get(key, default) not in (default, None):
            raise ValueError(f"generation_config.json sets {key}={generation[key]!r}, which this runtime does not do")

    def pick(key: str, fallback=None):
        value = generation.get(key)
        return config.get(key, fallback) if value is None else value

    eos = pick("eos_token_id")
    eos_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    bad_words = generation.get("bad_words_ids") or []
    if any(len(sequence) != 1 for sequence in bad_words):
        raise ValueError(
            f"generation_config.json sets bad_words_ids={bad_words!r}; this runtime bans single tokens only"
        )
    # transformers drops a banned word that is exactly an EOS token (NoBadWordsLogitsProcessor)
    banned = [sequence[0] for sequence in bad_words if sequence[0] not in eos_ids]
    start = pick("decoder_start_token_id", pick("bos_token_id"))
    if start is None:
        raise ValueError(f"{folder}: no decoder_start_token_id in config.json or generation_config.json")
    max_new = generation.get("max_new_tokens") or generation.get("max_length", 20) - 1
    min_new = generation.get("min_new_tokens") or max(generation.get("min_length", 0) - 1, 0)
    return GenerationSettings(
        decoder_start_token_id=start,
        eos_token_ids=eos_ids,
        pad_token_id=pick("pad_token_id"),
        max_new_tokens=max_new,
        min_new_tokens=min_new,
        num_beams=generation.get("num_beams", 1),
        length_penalty=generation.get("length_penalty", 1.0),
        early_stopping=generation.get("early_stopping", False),
        forced_eos_token_id=generation.get("forced_eos_token_id"),
        banned_token_ids=banned,
        renormalize_logits=bool(generation.get("renormalize_logits", False)),
    )


def target_vocab_size(config: dict) -> int:
    """Rows of the logits: the decoder's vocabulary (`decoder_vocab_size` when the embeddings are not shared)."""
    if config.get("share_encoder_decoder_embeddings", True) or not config.get("decoder_vocab_size"):
        return config["vocab_size"]
    return config["decoder_vocab_size"]


def load_tokenizer(folder: Path):
    """`tokenizer.json` with the `tokenizers` package, or Marian's sentencepiece files (source.spm, target.spm,
    vocab.json); both offer `encode_batch` and `decode_batch`."""
    if (folder / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(folder / "tokenizer.json"))
    if is_marian_tokenizer_folder(folder):
        return MarianSentencePieceTokenizer(folder)
    raise ValueError(
        f"Export folder {folder} has no tokenizer.json (nor Marian's source.spm, target.spm, vocab.json); "
        "re-run export/export_onnx.py"
    )


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


def scores_feed(running_scores: np.ndarray, bias: np.ndarray, batch_size: int, k: int) -> dict[str, np.ndarray]:
    """The `beam_scores.onnx` inputs besides the logits."""
    return {
        "running_scores": np.ascontiguousarray(running_scores, dtype=np.float32),
        "bias": bias,
        "scores_shape": np.array([batch_size, -1], dtype=np.int64),
        "k": np.array([k], dtype=np.int64),
    }


class _NumpyState:
    """Decoder cache held as numpy arrays; the runtime feeds them every step (CPU provider).

    With a `scorer` session (`beam_scores.onnx`) it offers `step_top_k`, and beam search ranks its candidates there.
    """

    def __init__(
        self,
        session,
        cross: dict[str, np.ndarray],
        mask: np.ndarray,
        past: dict[str, np.ndarray],
        vocab_size: int,
        scorer=None,
    ):
        self.session, self.cross, self.mask, self.past = session, cross, mask, past
        self.vocab_size, self.scorer = vocab_size, scorer
        self.output_names = [o.name for o in session.get_outputs()]
        if scorer is not None:  # without it, beam search ranks in numpy
            self.step_top_k = self._step_top_k

    def _run(self, last_tokens: np.ndarray) -> np.ndarray:
        """One decoder step; keeps the presents as the next past and returns the logits (rows, new_tokens, vocab)."""
        feed = {"input_ids": last_tokens, "encoder_attention_mask": self.mask, **self.cross, **self.past}
        outputs = dict(zip(self.output_names, self.session.run(None, feed), strict=True))
        self.past = {
            name.replace("present.", "past_key_values.", 1): v for name, v in outputs.items() if name != "logits"
        }
        return outputs["logits"]

    def step(self, last_tokens: np.ndarray) -> np.ndarray:
        return np.asarray(self._run(last_tokens)[:, -1, :], dtype=np.float32)  # (rows, vocab), a view for fp32

    def _step_top_k(
        self, last_tokens: np.ndarray, running_scores: np.ndarray, bias: np.ndarray, batch_size: int, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        feed = {"logits": self._run(last_tokens), **scores_feed(running_scores, bias, batch_size, k)}
        values, indices = self.scorer.run(None, feed)
        return values, indices

    def reorder(self, rows: np.ndarray) -> None:
        """Keep cache rows `rows`, in place: only rows whose beam changed are copied.

        The cache arrays are the decoder's own outputs, so they can be overwritten. A gather into fresh arrays copied
        the whole cache twice per step, into memory the OS had to page in each time: at beam 4, batch 16 and base
        size that cost a third of the decoder run.
        """
        changed = np.flatnonzero(rows != np.arange(rows.shape[0]))
        if changed.size == 0:
            return
        sources = rows[changed]
        for value in self.past.values():
            value[changed] = value[sources]  # the right side is gathered first, so overlapping rows are safe


class _BoundState:
    """Decoder cache kept on the device through I/O binding: presents of one step are the next step's past.

    Greedy steps bring the logits back to the host. With a `scorer` (`beam_scores.onnx`), beam steps keep the logits
    on the device too and only the top k candidates come back. Beam reordering runs the `cache_reorder.onnx` helper
    graph on the same device; without it (older export folders) the cache rows are gathered on the host instead.
    """

    def __init__(
        self,
        session,
        cross: dict,
        mask: np.ndarray,
        past: dict,
        device: str,
        vocab_size: int,
        reorder_session=None,
        scorer=None,
    ):
        import onnxruntime as ort

        self.ort, self.session, self.device, self.reorder_session = ort, session, device, reorder_session
        self.vocab_size, self.scorer = vocab_size, scorer
        self.binding = session.io_binding()
        self.output_names = [o.name for o in session.get_outputs()]
        self.past_names = [n.replace("present.", "past_key_values.", 1) for n in self.output_names[1:]]
        self.on_device = {name: self._upload(value) for name, value in {**cross, **past}.items()}
        self.on_device["encoder_attention_mask"] = self._upload(mask)
        if scorer is not None:  # without it, beam search ranks on the host
            self.step_top_k = self._step_top_k

    def _upload(self, array: np.ndarray):
        return self.ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), self.device, 0)

    def _run(self, last_tokens: np.ndarray, logits_on: str):
        """One decoder step; the presents stay on the device as the next past. Returns the logits OrtValue."""
        binding = self.binding
        binding.clear_binding_inputs()
        binding.clear_binding_outputs()
        binding.bind_cpu_input("input_ids", np.ascontiguousarray(last_tokens))
        for name, value in self.on_device.items():
            binding.bind_ortvalue_input(name, value)
        binding.bind_output("logits", logits_on, 0)
        for name in self.output_names[1:]:
            binding.bind_output(name, self.device, 0)
        self.session.run_with_iobinding(binding)
        outputs = binding.get_outputs()
        for name, value in zip(self.past_names, outputs[1:], strict=True):
            self.on_device[name] = value
        return outputs[0]

    def step(self, last_tokens: np.ndarray) -> np.ndarray:
        return self._run(last_tokens, "cpu").numpy()[:, -1, :].astype(np.float32)

    def _step_top_k(
        self, last_tokens: np.ndarray, running_scores: np.ndarray, bias: np.ndarray, batch_size: int, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        logits = self._run(last_tokens, self.device)
        binding = self.scorer.io_binding()
        binding.bind_ortvalue_input("logits", logits)
        for name, value in scores_feed(running_scores, bias, batch_size, k).items():
            binding.bind_cpu_input(name, value)
        binding.bind_output("values", "cpu")
        binding.bind_output("indices", "cpu")
        self.scorer.run_with_iobinding(binding)
        values, indices = (value.numpy() for value in binding.get_outputs())
        return values, indices

    def reorder(self, rows: np.ndarray) -> None:
        if self.reorder_session is None:
            if self.device == "cpu":
                host = [self.on_device[name].numpy() for name in self.past_names]
            else:  # the last run's presents are the current cache
                host = self.binding.copy_outputs_to_cpu()[1:]
            for name, value in zip(self.past_names, host, strict=True):
                self.on_device[name] = self._upload(value[rows])
            return
        binding = self.reorder_session.io_binding()
        binding.bind_cpu_input("beam_idx", np.ascontiguousarray(rows, dtype=np.int64))
        for name in self.past_names:
            binding.bind_ortvalue_input(name, self.on_device[name])
            binding.bind_output(name.replace("past_key_values.", "reordered.", 1), self.device, 0)
        self.reorder_session.run_with_iobinding(binding)
        for name, value in zip(self.past_names, binding.get_outputs(), strict=True):
            self.on_device[name] = value


class OrtTranslator:
    """Translate with an exported folder (see `vanilla_transformer.onnx_export.export_model`) on onnxruntime.

    Args:
        folder: export folder with `encoder_model.onnx`, `decoder_model.onnx`, `config.json` and `tokenizer.json`
            (or Marian's `source.spm`, `target.spm`, `vocab.json`).
        provider: "auto" (CUDA when onnxruntime-gpu and a GPU are present, else CPU), "cpu" or "cuda".
        intra_op_num_threads: threads per operator; set it explicitly on shared machines.
        use_io_binding: keep the KV cache in onnxruntime values between steps; defaults to True on CUDA.
        enable_cpu_mem_arena: keep onnxruntime's CPU memory arena (off by default: lower peak memory, same speed).
        session_config: extra onnxruntime session config entries, e.g. `{"session.intra_op.allow_spinning": "0"}`.
        disabled_optimizers: onnxruntime graph fusions to skip; by default `CPU_DISABLED_OPTIMIZERS` on the CPU
            provider (slower fused kernels, see `create_session`) and none on CUDA; `()` keeps them all.
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        provider: str = "auto",
        intra_op_num_threads: int = 1,
        use_io_binding: bool | None = None,
        enable_cpu_mem_arena: bool = False,
        session_config: dict[str, str] | None = None,
        disabled_optimizers: Sequence[str] | None = None,
    ):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise ValueError(f"Export folder {self.folder} does not exist")
        for name in (ENCODER_FILE, DECODER_FILE, "config.json"):
            if not (self.folder / name).is_file():
                raise ValueError(f"Export folder {self.folder} has no {name}; re-run export/export_onnx.py")
        self.tokenizer = load_tokenizer(self.folder)
        requested = resolve_provider(provider)
        options = session_options(intra_op_num_threads, enable_cpu_mem_arena, session_config)
        providers = [requested] if requested == PROVIDERS["cpu"] else [requested, PROVIDERS["cpu"]]

        def session(name: str):
            return create_session(self.folder / name, options, providers, disabled_optimizers)

        self.encoder = session(ENCODER_FILE)
        self.decoder = session(DECODER_FILE)
        self.reorder = session(REORDER_FILE) if (self.folder / REORDER_FILE).is_file() else None  # I/O binding only
        # Folders exported before beam_scores.onnx rank beam candidates in numpy.
        self.beam_scores = session(BEAM_SCORES_FILE) if (self.folder / BEAM_SCORES_FILE).is_file() else None
        # onnxruntime-gpu lists CUDA even without a GPU and silently falls back to CPU: report what is used.
        self.provider = self.decoder.get_providers()[0]
        if requested != self.provider:
            logger.warning("Requested %s, onnxruntime uses %s", requested, self.provider)
        self.device = "cuda" if self.provider == PROVIDERS["cuda"] else "cpu"
        self.use_io_binding = self.device == "cuda" if use_io_binding is None else use_io_binding
        self.settings = settings_from_folder(self.folder)
        self.config = json.loads((self.folder / "config.json").read_text())
        self.num_layers = self.config["decoder_layers"]
        self.num_heads = self.config["decoder_attention_heads"]
        self.d_head = self.config["d_model"] // self.num_heads
        self.cache_dtype = np.float16 if self.decoder.get_inputs()[2].type == "tensor(float16)" else np.float32

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
        state = self._start(input_ids, attention_mask, settings.num_beams)
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

    def _start(self, input_ids: np.ndarray, attention_mask: np.ndarray, num_beams: int) -> DecoderState:
        """Run the encoder once; every beam of a sentence shares its cross-attention K/V."""
        names = [o.name for o in self.encoder.get_outputs()]
        outputs = dict(
            zip(names, self.encoder.run(None, {"input_ids": input_ids, "attention_mask": attention_mask}), strict=True)
        )
        cross = {
            name.replace("present.", "past_key_values.", 1): np.repeat(value, num_beams, axis=0)
            for name, value in outputs.items()
            if name != "last_hidden_state"
        }
        mask = np.repeat(attention_mask, num_beams, axis=0)
        rows = input_ids.shape[0] * num_beams
        empty = np.zeros((rows, self.num_heads, 0, self.d_head), dtype=self.cache_dtype)
        past = {
            f"past_key_values.{i}.decoder.{kind}": empty for i in range(self.num_layers) for kind in ("key", "value")
        }
        vocab_size = target_vocab_size(self.config)
        if self.use_io_binding:
            return _BoundState(
                self.decoder, cross, mask, past, self.device, vocab_size, self.reorder, self.beam_scores
            )
        return _NumpyState(self.decoder, cross, mask, past, vocab_size, self.beam_scores)

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
