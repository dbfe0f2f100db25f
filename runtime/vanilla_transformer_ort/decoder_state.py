"""The decoder's past cache between steps: as numpy arrays (`NumpyState`), on the device (`BoundState`), or in
preallocated buffers that the in-place decoder graph writes (`InPlaceState`).

Both implement `search.DecoderState`: `step` runs the decoder graph once and keeps its `present.*` outputs as the next
step's `past_key_values.*`; `reorder` follows the surviving beams; with the `beam_scores.onnx` helper session,
`step_top_k` also ranks a beam step's candidates in onnxruntime.
"""

from __future__ import annotations

import numpy as np

from .contract import (
    BEAM_SCORES_INPUTS,
    BEAM_SCORES_OUTPUTS,
    ENCODER_ATTENTION_MASK,
    INPUT_IDS,
    LOGITS,
    REORDER_INDEX,
    SEQUENCE_LENGTHS,
    TOTAL_SEQUENCE_LENGTH,
    past_name,
    reordered_name,
)
from .sessions import import_onnxruntime


def scores_feed(running_scores: np.ndarray, bias: np.ndarray, batch_size: int, k: int) -> dict[str, np.ndarray]:
    """The `beam_scores.onnx` inputs besides the logits."""
    values = (
        np.ascontiguousarray(running_scores, dtype=np.float32),
        bias,
        np.array([batch_size, -1], dtype=np.int64),
        np.array([k], dtype=np.int64),
    )
    return dict(zip(BEAM_SCORES_INPUTS[1:], values, strict=True))


class CacheState:
    """What both cache holders share: the decoder session, the logits' width and the optional ranking session.

    `ranks_candidates` is True when a `scorer` session (`beam_scores.onnx`) was given; only then may beam search call
    `step_top_k`. Without it (folders exported before that helper) beam search ranks in numpy.
    """

    def __init__(self, session, vocab_size: int, scorer=None):
        self.session, self.vocab_size, self.scorer = session, vocab_size, scorer
        self.output_names = [o.name for o in session.get_outputs()]  # logits, then present.{i}.decoder.*

    @property
    def ranks_candidates(self) -> bool:
        return self.scorer is not None

    def _require_scorer(self) -> None:
        if self.scorer is None:
            raise RuntimeError("step_top_k needs the beam_scores.onnx session; check ranks_candidates first")

    def step_top_k(
        self, last_tokens: np.ndarray, running_scores: np.ndarray, bias: np.ndarray, batch_size: int, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """One decoder step (`_run`, the logits on the host) and the k best candidates of each sentence."""
        self._require_scorer()
        feed = {LOGITS: self._run(last_tokens), **scores_feed(running_scores, bias, batch_size, k)}
        values, indices = self.scorer.run(None, feed)
        return values, indices


class NumpyState(CacheState):
    """Decoder cache held as numpy arrays; the runtime feeds them every step (CPU provider)."""

    def __init__(
        self,
        session,
        cross: dict[str, np.ndarray],
        mask: np.ndarray,
        past: dict[str, np.ndarray],
        vocab_size: int,
        scorer=None,
    ):
        super().__init__(session, vocab_size, scorer)
        self.cross, self.mask, self.past = cross, mask, past

    def _run(self, last_tokens: np.ndarray) -> np.ndarray:
        """One decoder step; keeps the presents as the next past and returns the logits (rows, new_tokens, vocab)."""
        feed = {INPUT_IDS: last_tokens, ENCODER_ATTENTION_MASK: self.mask, **self.cross, **self.past}
        outputs = dict(zip(self.output_names, self.session.run(None, feed), strict=True))
        self.past = {past_name(name): value for name, value in outputs.items() if name != LOGITS}
        return outputs[LOGITS]

    def step(self, last_tokens: np.ndarray) -> np.ndarray:
        return np.asarray(self._run(last_tokens)[:, -1, :], dtype=np.float32)  # (rows, vocab), a view for fp32

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

    def keep_rows(self, rows: np.ndarray) -> None:
        """Only `rows` stay: the cache, the cross-attention K/V and the source mask shrink with finished sentences."""
        self.past = {name: value[rows] for name, value in self.past.items()}
        self.cross = {name: value[rows] for name, value in self.cross.items()}
        self.mask = self.mask[rows]


class BoundState(CacheState):
    """Decoder cache kept on the device through I/O binding: presents of one step are the next step's past.

    Greedy steps bring the logits back to the host. With a `scorer` (`beam_scores.onnx`), beam steps keep the logits
    on the device too and only the top k candidates come back. Beam reordering runs the `cache_reorder.onnx` helper
    graph (`reorder_session`) on the same device.
    """

    def __init__(
        self,
        session,
        cross: dict,
        mask: np.ndarray,
        past: dict,
        device: str,
        vocab_size: int,
        reorder_session,
        scorer=None,
    ):
        ort = import_onnxruntime()

        super().__init__(session, vocab_size, scorer)
        self.ort, self.device, self.reorder_session = ort, device, reorder_session
        self.binding = session.io_binding()
        self.past_names = [past_name(name) for name in self.output_names[1:]]
        self.on_device = {name: self._upload(value) for name, value in {**cross, **past}.items()}
        self.on_device[ENCODER_ATTENTION_MASK] = self._upload(mask)

    def _upload(self, array: np.ndarray):
        return self.ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), self.device, 0)

    def _run(self, last_tokens: np.ndarray, logits_on: str):
        """One decoder step; the presents stay on the device as the next past. Returns the logits OrtValue."""
        binding = self.binding
        binding.clear_binding_inputs()
        binding.clear_binding_outputs()
        binding.bind_cpu_input(INPUT_IDS, np.ascontiguousarray(last_tokens))
        for name, value in self.on_device.items():
            binding.bind_ortvalue_input(name, value)
        binding.bind_output(LOGITS, logits_on, 0)
        for name in self.output_names[1:]:
            binding.bind_output(name, self.device, 0)
        self.session.run_with_iobinding(binding)
        outputs = binding.get_outputs()
        for name, value in zip(self.past_names, outputs[1:], strict=True):
            self.on_device[name] = value
        return outputs[0]

    def step(self, last_tokens: np.ndarray) -> np.ndarray:
        return self._run(last_tokens, "cpu").numpy()[:, -1, :].astype(np.float32)

    def step_top_k(
        self, last_tokens: np.ndarray, running_scores: np.ndarray, bias: np.ndarray, batch_size: int, k: int
    ) -> tuple[np.ndarray, np.ndarray]:
        self._require_scorer()
        logits = self._run(last_tokens, self.device)
        binding = self.scorer.io_binding()
        binding.bind_ortvalue_input(LOGITS, logits)
        for name, value in scores_feed(running_scores, bias, batch_size, k).items():
            binding.bind_cpu_input(name, value)
        for name in BEAM_SCORES_OUTPUTS:
            binding.bind_output(name, "cpu")
        self.scorer.run_with_iobinding(binding)
        # Copies: `OrtValue.numpy()` is a view of memory that onnxruntime frees with the binding's outputs.
        values, indices = (np.array(value.numpy()) for value in binding.get_outputs())
        return values, indices

    def reorder(self, rows: np.ndarray) -> None:
        binding = self.reorder_session.io_binding()
        binding.bind_cpu_input(REORDER_INDEX, np.ascontiguousarray(rows, dtype=np.int64))
        for name in self.past_names:
            binding.bind_ortvalue_input(name, self.on_device[name])
            binding.bind_output(reordered_name(name), self.device, 0)
        self.reorder_session.run_with_iobinding(binding)
        for name, value in zip(self.past_names, binding.get_outputs(), strict=True):
            self.on_device[name] = value


class InPlaceState(CacheState):
    """Decoder cache in preallocated buffers that the in-place decoder graph (`decoder_model_inplace.onnx`) writes.

    Each `past_key_values.{i}.decoder.*` input and its `present.{i}.decoder.*` output are bound (I/O binding) to the
    same numpy buffer of shape (rows, heads, capacity, d_k), so onnxruntime's `GroupQueryAttention` writes a step's
    keys and values in place instead of copying the cache into new outputs. The buffers start at `capacity`
    positions and double when a step would overflow them (one copy of what was decoded so far, as a growing array
    does), never past `max_capacity` (the generation's own length limit, when known). The cross-attention
    keys/values and the source mask are held once per source, (batch, ...), and read by all `num_beams` rows of
    that source. The logits of one step live in a buffer that the next step overwrites.
    """

    def __init__(
        self,
        session,
        cross: dict[str, np.ndarray],
        mask: np.ndarray,
        num_beams: int,
        num_heads: int,
        d_head: int,
        vocab_size: int,
        scorer=None,
        capacity: int = 16,
        max_capacity: int | None = None,
    ):
        super().__init__(session, vocab_size, scorer)
        self.ort = import_onnxruntime()
        self.num_beams, self.length, self.max_capacity = num_beams, 0, max_capacity
        self.cross, self.mask = cross, mask
        self.cache_names = [past_name(name) for name in self.output_names[1:]]  # past_key_values.{i}.decoder.*
        # Folders of format version 3 take each row's length (`sequence_lengths`); here all rows advance together.
        self.per_row_lengths = SEQUENCE_LENGTHS in {i.name for i in session.get_inputs()}
        rows = mask.shape[0] * num_beams
        shape = (rows, num_heads, max(1, capacity), d_head)
        self.buffers = {name: np.zeros(shape, dtype=np.float32) for name in self.cache_names}
        self.binding = session.io_binding()
        self._bind_sources()
        self._bind_cache()

    def _value(self, array: np.ndarray):
        """An OrtValue over the array's own memory (CPU): onnxruntime reads and writes the numpy buffer."""
        return self.ort.OrtValue.ortvalue_from_numpy(array)

    def _bind_sources(self) -> None:
        self.mask = np.ascontiguousarray(self.mask, dtype=np.int64)
        self.cross = {name: np.ascontiguousarray(value) for name, value in self.cross.items()}
        self.binding.bind_ortvalue_input(ENCODER_ATTENTION_MASK, self._value(self.mask))
        for name, value in self.cross.items():
            self.binding.bind_ortvalue_input(name, self._value(value))

    def _bind_cache(self) -> None:
        rows = next(iter(self.buffers.values())).shape[0]
        self.logits = np.empty((rows, 1, self.vocab_size), dtype=np.float32)  # the usual one-token step
        for name, output in zip(self.cache_names, self.output_names[1:], strict=True):
            value = self._value(self.buffers[name])
            self.binding.bind_ortvalue_input(name, value)
            self.binding.bind_ortvalue_output(output, value)  # the same buffer: written in place

    @property
    def capacity(self) -> int:
        return next(iter(self.buffers.values())).shape[2]

    def _grow(self, needed: int) -> None:
        """Re-allocate every buffer for at least `needed` positions, keeping the `length` decoded so far."""
        capacity = max(needed, 2 * self.capacity)
        if self.max_capacity is not None:
            capacity = max(needed, min(capacity, self.max_capacity))
        for name, old in self.buffers.items():
            new = np.zeros((*old.shape[:2], capacity, old.shape[3]), dtype=old.dtype)
            new[:, :, : self.length] = old[:, :, : self.length]
            self.buffers[name] = new
        self._bind_cache()

    def _run(self, last_tokens: np.ndarray) -> np.ndarray:
        """One decoder step written into the cache buffers; returns the logits (rows, new_tokens, vocab)."""
        rows, new = last_tokens.shape
        if new > 1 and self.length > 0 and rows > 1:
            raise ValueError(
                "onnxruntime's GroupQueryAttention takes several new tokens after a past only for one row; "
                "decode one token per step, or use the copying decoder (decoder_cache='copy')"
            )
        total = self.length + new
        if total > self.capacity:
            self._grow(total)
        binding = self.binding
        binding.bind_cpu_input(INPUT_IDS, np.ascontiguousarray(last_tokens, dtype=np.int64))
        binding.bind_cpu_input(TOTAL_SEQUENCE_LENGTH, np.array(total, dtype=np.int32))
        if self.per_row_lengths:
            binding.bind_cpu_input(SEQUENCE_LENGTHS, np.full(rows, total, dtype=np.int32))
        if new == 1:
            binding.bind_ortvalue_output(LOGITS, self._value(self.logits))
        else:
            binding.bind_output(LOGITS, "cpu")
        self.session.run_with_iobinding(binding)
        self.length = total
        return self.logits if new == 1 else binding.get_outputs()[0].numpy()

    def step(self, last_tokens: np.ndarray) -> np.ndarray:
        return self._run(last_tokens)[:, -1, :]  # (rows, vocab), a view into the logits buffer

    def reorder(self, rows: np.ndarray) -> None:
        """Keep cache rows `rows`, in place: only the decoded positions of rows whose beam changed are copied."""
        changed = np.flatnonzero(rows != np.arange(rows.shape[0]))
        if changed.size == 0:
            return
        sources, length = rows[changed], self.length
        for buffer in self.buffers.values():
            buffer[changed, :, :length] = buffer[sources, :, :length]  # the right side is gathered first

    def keep_rows(self, rows: np.ndarray) -> None:
        """Only `rows` (whole sentences: all beams of a source) stay. Each buffer is compacted in place: the decoded
        positions of the kept rows move to its front, and its first rows (a contiguous view) become the cache; the
        cross K/V and the mask are compacted the same way. Nothing is allocated and only what is read is copied.
        """
        kept, length = rows.shape[0], self.length
        for name, buffer in self.buffers.items():
            buffer[:kept, :, :length] = buffer[rows, :, :length]  # the right side is gathered first
            self.buffers[name] = buffer[:kept]  # (kept, heads, capacity, d_head), contiguous
        sources = rows[:: self.num_beams] // self.num_beams
        for name, value in self.cross.items():
            value[: sources.shape[0]] = value[sources]
            self.cross[name] = value[: sources.shape[0]]
        self.mask = self.mask[sources]
        self._bind_sources()
        self._bind_cache()
