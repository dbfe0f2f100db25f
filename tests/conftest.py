"""Shared fixtures: tiny models with deliberately unequal sizes, so that a swapped axis fails loudly."""

import math
import multiprocessing
import os
import time

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration  # noqa: E402

TINY = dict(
    vocab_size=37,
    d_model=16,
    encoder_layers=2,
    decoder_layers=3,
    encoder_attention_heads=4,
    decoder_attention_heads=2,
    encoder_ffn_dim=24,
    decoder_ffn_dim=20,
    dropout=0.0,
    max_position_embeddings=12,
)


def make_config(**overrides) -> VanillaTransformerConfig:
    return VanillaTransformerConfig(**{**TINY, **overrides})


def make_model(seed: int = 0, **overrides) -> VanillaTransformerForConditionalGeneration:
    torch.manual_seed(seed)
    return VanillaTransformerForConditionalGeneration(make_config(**overrides)).eval()


def padded_batch(seed: int = 1, batch: int = 3, src_len: int = 9, vocab: int = 37):
    """Token ids without specials (3..vocab-1), ending in </s>, with rows padded to different lengths."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, vocab, (batch, src_len), generator=g)
    mask = torch.ones_like(ids)
    for row, n_pad in enumerate(range(batch)):
        length = src_len - 2 * n_pad
        ids[row, length - 1] = 2
        ids[row, length:] = 0
        mask[row, length:] = 0
    return ids, mask


def closed_form_pe(length: int, d_model: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...), written out element by element (§3.5)."""
    pe = torch.zeros(length, d_model)
    for pos in range(length):
        for j in range(d_model):
            angle = pos / 10000 ** (2 * (j // 2) / d_model)
            pe[pos, j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
    return pe


def pytest_unconfigure(config):
    """The run is over: from now on the interpreter must exit (tests/exit_watchdog.py)."""
    from tests import exit_watchdog

    exit_watchdog.start()


@pytest.fixture(scope="module", autouse=True)
def no_child_process_outlives_its_module(request):
    """A test module leaves no multiprocessing child running (a session process left open is killed here and
    reported): one left behind holds a model in memory for the rest of the run, and a child that ignores SIGTERM
    could keep the interpreter from exiting."""
    before = set(multiprocessing.active_children())
    yield
    deadline = time.monotonic() + 10
    while (left := set(multiprocessing.active_children()) - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    for process in left:
        process.kill()
    if left:
        names = ", ".join(f"{p.name} (pid {p.pid})" for p in left)
        pytest.fail(f"{request.module.__name__} left child processes running: {names}")


@pytest.fixture
def tiny_config() -> VanillaTransformerConfig:
    return make_config()


@pytest.fixture
def tiny_model() -> VanillaTransformerForConditionalGeneration:
    return make_model()
