"""Joint source+target BPE vocabulary (paper §5.1: ~37k tokens shared by English and German).

The tokenizer is byte-level BPE, so every string is representable (no `<unk>` in practice) and decoding restores the
original text, spacing included. Special tokens take the ids the model config expects: `<pad>`=0, `<s>`=1 (bos and
decoder start), `</s>`=2, `<unk>`=3.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast
from transformers.utils import logging

from vanilla_transformer_ort.contract import SAVED_TOKENIZER_FILES, TOKENIZER_FILES  # noqa: F401 (re-exported)

logger = logging.get_logger(__name__)

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)  # position in this tuple = token id
SPECIAL_TOKEN_IDS = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
DEFAULT_VOCAB_SIZE = 37000


def train_bpe_tokenizer(
    texts: Iterable[str],
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    min_frequency: int = 2,
    model_max_length: int = 1024,
    show_progress: bool = False,
    add_prefix_space: bool = False,
) -> PreTrainedTokenizerFast:
    """Train one byte-level BPE vocabulary on source and target sentences together (paper §5.1).

    Args:
        texts: sentences of both languages; pass source and target sides of every pair.
        vocab_size: target vocabulary size including the 4 special tokens and the 256 byte symbols.
        min_frequency: a merge needs at least this many occurrences.
        model_max_length: recorded in the tokenizer config (the model's `max_position_embeddings`).
        show_progress: show the `tokenizers` progress bar.
        add_prefix_space: encode every text as if it began with a space, so a sentence's first word takes the same
            tokens as inside a sentence ("Image saved" and "Open Image" share the tokens of "ĠImage"); decoding
            removes that one space again. Texts that begin with whitespace then lose one leading space in a round
            trip; everything else decodes exactly.

    Returns:
        A `PreTrainedTokenizerFast` whose `__call__(src, text_target=tgt)` gives `input_ids` and `labels`, each ending
        in `</s>`; the decoder start `<s>` is prepended by the model when it shifts the labels.
    """
    if vocab_size < len(SPECIAL_TOKENS) + 256:
        raise ValueError(
            f"vocab_size={vocab_size} is too small: byte-level BPE needs at least {len(SPECIAL_TOKENS) + 256} "
            "entries (4 special tokens and 256 bytes). Pass a larger --vocab_size."
        )
    backend = Tokenizer(models.BPE(unk_token=UNK_TOKEN))
    # No normaliser: decode(encode(x)) == x exactly (with a prefix space: for every x not starting with whitespace).
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    # With a prefix space, the ByteLevel decoder's one joined string loses the space the encoder added (Strip).
    byte_level = decoders.ByteLevel()
    backend.decoder = decoders.Sequence([byte_level, decoders.Strip(" ", 1, 0)]) if add_prefix_space else byte_level
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    counter = _CountingIterator(texts)
    backend.train_from_iterator(counter, trainer=trainer)
    if counter.count == 0:
        raise ValueError("Cannot train a tokenizer on an empty corpus: no sentences were given.")
    for token, expected_id in SPECIAL_TOKEN_IDS.items():
        if backend.token_to_id(token) != expected_id:  # guaranteed by the trainer's ordering; checked to be explicit
            raise ValueError(f"Special token {token!r} got id {backend.token_to_id(token)}, expected {expected_id}.")
    # Marian convention: every sequence (source and target) ends with </s>.
    backend.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS_TOKEN}",
        pair=f"$A {EOS_TOKEN} $B {EOS_TOKEN}",
        special_tokens=[(EOS_TOKEN, SPECIAL_TOKEN_IDS[EOS_TOKEN])],
    )
    logger.info(f"Trained a BPE vocabulary of {backend.get_vocab_size()} tokens on {counter.count} sentences.")
    return wrap_tokenizer(backend, model_max_length=model_max_length)


def wrap_tokenizer(backend: Tokenizer, model_max_length: int = 1024) -> PreTrainedTokenizerFast:
    """Wrap a `tokenizers.Tokenizer` with the project's special tokens so `AutoTokenizer` can reload it."""
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,  # keep the original spacing on decode
        padding_side="right",
    )


def check_special_token_ids(tokenizer: PreTrainedTokenizerFast, config) -> None:
    """Raise if the tokenizer's special ids differ from the model config's `pad/eos/decoder_start` ids.

    The decoder starts from `<s>`; a tokenizer without one (Marian's) starts it from `<pad>`, as Marian does."""
    start, start_name = tokenizer.bos_token_id, "decoder_start_token_id (= bos)"
    if start is None:
        start, start_name = tokenizer.pad_token_id, "decoder_start_token_id (= pad: the tokenizer has no bos)"
    pairs = {
        "pad_token_id": (tokenizer.pad_token_id, getattr(config, "pad_token_id", None)),
        "eos_token_id": (tokenizer.eos_token_id, getattr(config, "eos_token_id", None)),
        start_name: (start, getattr(config, "decoder_start_token_id", None)),
    }
    wrong = {name: ids for name, ids in pairs.items() if ids[0] != ids[1]}
    if wrong:
        details = ", ".join(f"{name}: tokenizer {tok} vs config {cfg}" for name, (tok, cfg) in wrong.items())
        raise ValueError(
            f"Tokenizer and model config disagree on special token ids ({details}). "
            "Retrain the tokenizer with vt-train-tokenizer or fix the config."
        )
    if len(tokenizer) > config.vocab_size:
        raise ValueError(
            f"The tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {config.vocab_size}; "
            "pass --vocab_size to the model or use a smaller tokenizer."
        )


class _CountingIterator:
    """Iterates over texts, skipping empty ones, and counts what it yields."""

    def __init__(self, texts: Iterable[str]):
        self.texts = texts
        self.count = 0

    def __iter__(self) -> Iterator[str]:
        for text in self.texts:
            if text:
                self.count += 1
                yield text
