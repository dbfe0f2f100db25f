"""The torch-free runtime does not leak: thousands of `translate` calls in one process, mixing batch sizes, source and
output lengths and beams, leave its resident set flat after a warm-up."""

import contextlib
import ctypes
import gc
import random
import statistics
from pathlib import Path

import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from tests.onnx_helpers import SPECIALS, WORDS, build_tokenizer  # noqa: E402
from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration  # noqa: E402
from vanilla_transformer.export.onnx.export import export_model  # noqa: E402
from vanilla_transformer_ort import OrtTranslator  # noqa: E402

CALLS, WARMUP, EVERY = 2_700, 200, 250  # 10 readings after the warm-up
BATCHES, BEAMS = (1, 2, 4, 8, 16), (1, 2, 4)
MAX_WORDS, MAX_NEW_TOKENS = 40, 24
MAX_GROWTH = 0.05


def settled_rss_mib() -> float:
    """VmRSS after a garbage collection and glibc's malloc_trim(0): without the trim a reading swings with the
    size of the calls just before it (freed memory the allocator keeps), which would hide a leak or fake one."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: the reading includes the allocator's free memory
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    pytest.skip("no VmRSS in /proc/self/status")


@pytest.mark.slow
def test_resident_set_stays_flat_over_thousands_of_calls(tmp_path):
    torch.manual_seed(0)  # the "tiny" preset with random weights: outputs of every length up to the limit
    config = VanillaTransformerConfig.from_preset("tiny", vocab_size=len(SPECIALS) + len(WORDS))
    VanillaTransformerForConditionalGeneration(config).save_pretrained(tmp_path / "model")
    build_tokenizer().save_pretrained(tmp_path / "model")
    export_model(tmp_path / "model", tmp_path / "onnx")
    translator = OrtTranslator(tmp_path / "onnx", provider="cpu", intra_op_num_threads=2)
    rng = random.Random(0)
    largest = [(batch, beams) for batch in BATCHES for beams in BEAMS]  # the warm-up meets these first
    readings = []
    for call in range(1, CALLS + 1):
        if call <= len(largest):
            (batch, beams), new_tokens = largest[call - 1], MAX_NEW_TOKENS
            lengths = [MAX_WORDS] * batch
        else:
            batch, beams, new_tokens = rng.choice(BATCHES), rng.choice(BEAMS), rng.randint(2, MAX_NEW_TOKENS)
            lengths = [rng.randint(1, MAX_WORDS) for _ in range(batch)]
        texts = [" ".join(rng.choices(WORDS, k=length)) for length in lengths]
        assert len(translator.translate(texts, num_beams=beams, max_new_tokens=new_tokens)) == batch
        if call > WARMUP and (call - WARMUP) % EVERY == 0:
            readings.append(settled_rss_mib())
    start, end = statistics.median(readings[:5]), statistics.median(readings[-5:])
    assert end / start - 1 < MAX_GROWTH, f"RSS {start:.1f} -> {end:.1f} MiB; readings {readings}"
