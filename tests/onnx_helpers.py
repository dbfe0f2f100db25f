"""A tiny trained model, its tokenizer and its ONNX export, built once per test process and shared by the ONNX tests.

The model learns a copy task for a few dozen steps so that its next-token distributions are peaked: comparisons of
greedy and beam outputs with `generate()` then test the decoding logic, not the tie-breaking of a random model.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import string
import tempfile
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.export.onnx.export import export_model
from vanilla_transformer.export.onnx.validation import validate_folder

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]  # ids 0..3, the model's pad / bos+decoder start / eos / unk
WORDS = list(string.ascii_lowercase) + list("0123456")  # 33 words: vocab 37
# Deliberately unequal sizes (a swapped axis fails loudly); max_position_embeddings is small so the export checks
# run past it.
CONFIG = dict(
    vocab_size=len(SPECIALS) + len(WORDS),
    d_model=32,
    encoder_layers=2,
    decoder_layers=3,
    encoder_attention_heads=4,
    decoder_attention_heads=2,
    encoder_ffn_dim=48,
    decoder_ffn_dim=40,
    dropout=0.0,
    attention_dropout=0.0,
    activation_dropout=0.0,
    max_position_embeddings=12,
)
SENTENCES = ["a b c d", "q r s t u v w x y", "m n", "h e l l o w o r l d", "z"]


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level tokenizer over single letters/digits; appends </s> like the training data."""
    vocab = {token: i for i, token in enumerate(SPECIALS + WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def _copy_batch(generator: torch.Generator, batch: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    lengths = torch.randint(1, 10, (batch,), generator=generator)
    width = int(lengths.max()) + 1
    input_ids = torch.zeros(batch, width, dtype=torch.long)
    labels = torch.full((batch, width), -100, dtype=torch.long)
    for row, length in enumerate(lengths.tolist()):
        words = torch.randint(len(SPECIALS), CONFIG["vocab_size"], (length,), generator=generator)
        sequence = torch.cat([words, torch.tensor([2])])
        input_ids[row, : length + 1] = sequence
        labels[row, : length + 1] = sequence
    return input_ids, (input_ids != 0).long(), labels


def train_copy_model(steps: int = 120, seed: int = 0, **overrides) -> VanillaTransformerForConditionalGeneration:
    """Adam steps (short warmup) on copying. The shared fixture's 120 steps leave the copy loss near chance (3.07
    against 3.6 on the AMD EPYC development machine, torch 2.13): outputs of varied lengths, small logits, which the
    export tolerances were set on. 500 steps give a model that copies (loss 0.15, about 12 s on 2 cores).
    `overrides` change config fields (a larger `vocab_size` leaves tokens that the copy data never uses)."""
    torch.manual_seed(seed)
    model = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig(**{**CONFIG, **overrides}))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(steps):
        input_ids, attention_mask, labels = _copy_batch(generator, 32)
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    return model.eval()


def _temporary_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="vt-onnx-tests-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


@functools.cache
def trained_model_dir() -> Path:
    """save_pretrained folder of the trained copy model, with its tokenizer."""
    path = _temporary_dir() / "model"
    train_copy_model().save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    return path


@functools.cache
def copying_model_dir() -> Path:
    """save_pretrained folder of a copy model trained 500 steps, one that really copies, with its tokenizer."""
    path = _temporary_dir() / "copying-model"
    train_copy_model(steps=500).save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    return path


@functools.cache
def trained_export_dir() -> Path:
    """fp32 export of `trained_model_dir()`, validated on the shape grid (figures in its manifest)."""
    path = _temporary_dir() / "onnx"
    export_model(trained_model_dir(), path)
    validate_folder(trained_model_dir(), path)
    return path


@functools.cache
def trained_int8_export_dir(int8_activations: str = "row") -> Path:
    """int8 export of `trained_model_dir()` (activations quantized per row by default, as `export_model` does)."""
    path = _temporary_dir() / f"onnx-int8-{int8_activations}"
    export_model(trained_model_dir(), path, quantize="int8", int8_activations=int8_activations)
    return path


def load_trained_model() -> VanillaTransformerForConditionalGeneration:
    return VanillaTransformerForConditionalGeneration.from_pretrained(trained_model_dir()).eval()
