"""Joint BPE tokenizer: special-token ids, AutoTokenizer reload, exact round trip, bad input."""

import pytest
from transformers import AutoTokenizer

from tests.training_fixtures import *  # noqa: F403 (pytest fixtures)
from vanilla_transformer.training.tokenization import SPECIAL_TOKEN_IDS, check_special_token_ids, train_bpe_tokenizer

TRICKY = [
    "Hello,  world!  Two spaces.",
    " leading and trailing ",
    "Größe: 5 MB — Datei „test.txt“ nicht gefunden.",
    "tab\tinside and €uro 日本語 😀",
    "%s: cannot open '%s' (%d)",
]


def test_special_token_ids_match_model_defaults(toy_tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(toy_tokenizer_dir)
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (
        0,
        1,
        2,
        3,
    )
    assert SPECIAL_TOKEN_IDS == {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    assert tokenizer.convert_ids_to_tokens([0, 1, 2, 3]) == ["<pad>", "<s>", "</s>", "<unk>"]


def test_source_and_target_both_end_with_eos(toy_tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(toy_tokenizer_dir)
    batch = tokenizer(["the red house."], text_target=["die rote Haus."])
    assert batch["input_ids"][0][-1] == 2 and batch["labels"][0][-1] == 2
    assert 1 not in batch["input_ids"][0] and 1 not in batch["labels"][0]  # <s> is the decoder start, added later
    assert len(batch["attention_mask"][0]) == len(batch["input_ids"][0])


def test_round_trip_restores_corpus_and_odd_spacing(toy_tokenizer_dir, toy_pairs):
    tokenizer = AutoTokenizer.from_pretrained(toy_tokenizer_dir)
    texts = [text for pair in toy_pairs for text in pair] + TRICKY
    encoded = tokenizer(texts)["input_ids"]
    decoded = tokenizer.batch_decode(encoded, skip_special_tokens=True)
    assert decoded == texts
    assert tokenizer.unk_token_id not in {i for ids in encoded for i in ids}  # byte-level: nothing is unknown


def test_vocabulary_is_shared_and_sized(toy_pairs):
    tokenizer = train_bpe_tokenizer([text for pair in toy_pairs for text in pair], vocab_size=600)
    assert len(tokenizer) <= 600
    vocab = tokenizer.get_vocab()
    # one vocabulary for both sides: whole words of each language were merged into single tokens
    assert "house" in vocab or "Ġhouse" in vocab
    assert "Haus" in vocab or "ĠHaus" in vocab


def test_bad_input_names_the_problem():
    with pytest.raises(ValueError, match="empty corpus"):
        train_bpe_tokenizer(["", ""], vocab_size=300)
    with pytest.raises(ValueError, match="vocab_size=100 is too small"):
        train_bpe_tokenizer(["a b"], vocab_size=100)


def test_check_special_token_ids_against_config(toy_tokenizer_dir):
    from types import SimpleNamespace

    tokenizer = AutoTokenizer.from_pretrained(toy_tokenizer_dir)
    good = SimpleNamespace(pad_token_id=0, eos_token_id=2, decoder_start_token_id=1, vocab_size=len(tokenizer))
    check_special_token_ids(tokenizer, good)
    with pytest.raises(ValueError, match="pad_token_id: tokenizer 0 vs config 5"):
        check_special_token_ids(tokenizer, SimpleNamespace(**{**vars(good), "pad_token_id": 5}))
    with pytest.raises(ValueError, match="vocab_size is 10"):
        check_special_token_ids(tokenizer, SimpleNamespace(**{**vars(good), "vocab_size": 10}))


def test_prefix_space_gives_first_words_the_tokens_of_inner_words(toy_pairs):
    texts = [text for pair in toy_pairs for text in pair]
    plain = train_bpe_tokenizer(texts, vocab_size=600)
    prefixed = train_bpe_tokenizer(texts, vocab_size=600, add_prefix_space=True)
    word = texts[0].split()[0]

    def ids(tokenizer, text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    # "open open": the first word is tokenised like the second only with the prefix space
    assert ids(prefixed, f"{word} {word}") == ids(prefixed, word) * 2
    assert ids(plain, f"{word} {word}") != ids(plain, word) * 2
    # decoding drops the space the encoder added, and only that one
    clean = [text for text in texts + TRICKY if not text[:1].isspace()]
    assert prefixed.batch_decode(prefixed(clean)["input_ids"], skip_special_tokens=True) == clean
    assert prefixed.decode(prefixed("  two spaces")["input_ids"], skip_special_tokens=True) == " two spaces"
