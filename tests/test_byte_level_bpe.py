"""tiktoken's byte-level BPE gives the ids of the tokenizer it was built from (the oracle: `tokenizers` itself) on
every kind of text and every Unicode code point, and is refused for tokenizers it would not reproduce."""

import pickle
import random
import sys

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers.convert_slow_tokenizer import bytes_to_unicode

from tests.training_fixtures import make_pairs
from vanilla_transformer.training.byte_level_bpe import FastByteLevelBpe
from vanilla_transformer.training.tokenization import train_bpe_tokenizer

pytest.importorskip("tiktoken")

EDGE_TEXTS = [
    "Can't open the file's header; they'll see it, we've said: I'm sure he'd know. IT'S 'S 'LL",
    "  leading and trailing spaces  ",
    "tabs\tand\nnew\r\nlines\u00a0no-break\u2003em space \u3000ideographic",
    "numbers 12345 3.14 ١٢٣ ½ ² 10,000 №5",
    "Übergrößenträger straße ÆØÅ æøå çéèêë ñ İı ǅ",
    "emoji 😀👍🏽 👨‍👩‍👧 flags 🇩🇪",
    "中文字符和日本語のテキスト 한국어",
    "עברית ومرحبا بالعالم",
    "combining e\u0301 a\u0308 n\u0303",
    "%s %d %(name)s {0} {name!r} <b>bold</b> &amp; https://example.org/a?b=c#d",
    "special tokens inside: </s> and <s> and <pad><unk> stay special",
    "a</s>b",
    "    ",
    "x" * 300,
    "\x00\x01 control \x7f chars",
    "zero\u200bwidth\u200djoiner\ufeff",
]


def _backend(tokenizer) -> Tokenizer:
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_truncation()
    backend.no_padding()
    return backend


@pytest.fixture(scope="module", params=[(300, True), (700, False)], ids=["prefix-space", "no-prefix-space"])
def backend(request) -> Tokenizer:
    vocab_size, prefix_space = request.param
    pairs = make_pairs(400, seed=7)
    texts = [text for pair in pairs for text in pair] + EDGE_TEXTS
    return _backend(train_bpe_tokenizer(texts, vocab_size=vocab_size, add_prefix_space=prefix_space))


def _ids(backend: Tokenizer, texts: list[str]) -> list[list[int]]:
    return [encoding.ids for encoding in backend.encode_batch(texts)]


def test_ids_equal_the_tokenizers_on_varied_text(backend):
    fast = FastByteLevelBpe.from_tokenizer(backend)
    assert fast is not None
    rng = random.Random(3)
    words = [word for text in EDGE_TEXTS for word in text.split(" ")] + [" ", "  ", "\n", "'s", "'"]
    mixed = ["".join(rng.choice(words) + rng.choice(["", " ", "  "]) for _ in range(12)) for _ in range(500)]
    texts = EDGE_TEXTS + [text for pair in make_pairs(300, seed=11) for text in pair] + mixed
    assert fast.encode(texts) == _ids(backend, texts)
    again = pickle.loads(pickle.dumps(fast))  # what a datasets.map worker gets
    assert again._encoding is None and again.encode(texts) == _ids(backend, texts)


def _every_code_point_text(backend: Tokenizer, step: int) -> None:
    code_points = [c for c in range(0, 0x110000, step) if not 0xD800 <= c < 0xE000]
    # Each code point beside letters, digits, spaces, itself and an apostrophe: a difference in how the two regex
    # engines class it (letter, number, space, other) splits these differently.
    texts = [
        " ".join(f"a{chr(c)}b 1{chr(c)}2 {chr(c)}x  {chr(c)}{chr(c)} '{chr(c)}" for c in code_points[i : i + 64])
        for i in range(0, len(code_points), 64)
    ]
    assert FastByteLevelBpe.from_tokenizer(backend).encode(texts) == _ids(backend, texts)


def test_the_split_pattern_classes_code_points_alike(backend):
    _every_code_point_text(backend, step=7)


@pytest.mark.slow
def test_the_split_pattern_classes_every_code_point_alike(backend):
    _every_code_point_text(backend, step=1)


def _byte_level_bpe(merges: list[tuple[str, str]], **model) -> Tokenizer:
    symbols = list(bytes_to_unicode().values())
    vocab = {"</s>": 0, **{symbol: 1 + i for i, symbol in enumerate(symbols)}}
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, **model))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.add_special_tokens(["</s>"])
    return backend


def test_a_vocabulary_whose_bpe_splits_its_own_token_is_refused(caplog):
    # "bc" merges before "ab", so BPE ends "abc" as a + bc: the token "abc" (made by ab + c) is never reached,
    # while tiktoken, which takes a piece that is a whole token as it is, would give it.
    backend = _byte_level_bpe([("b", "c"), ("a", "b"), ("ab", "c")])
    assert _ids(backend, ["abc"]) == [[backend.token_to_id("a"), backend.token_to_id("bc")]]
    with caplog.at_level("INFO"):
        assert FastByteLevelBpe.from_tokenizer(backend) is None
    assert "BPE splits its own token 'abc'" in caplog.text
    assert FastByteLevelBpe.from_tokenizer(_byte_level_bpe([("a", "b"), ("ab", "c"), ("b", "c")])) is not None


REASONS = {
    "normalizer": "the tokenizer has a normalizer",
    "dropout": "BPE with dropout",
    "merge order": "the merge 'ab' + 'c' does not make the next token",
    "a token no merge makes": "the vocabulary holds tokens that no merge makes",
    "wordpiece": "a WordPiece model, not BPE",
}


@pytest.mark.parametrize("change", list(REASONS))
def test_other_tokenizers_are_refused(change, caplog):
    merges = [("a", "b"), ("ab", "c")]
    if change == "dropout":
        backend = _byte_level_bpe(merges, dropout=0.1)
    elif change == "merge order":  # the second product's id below the first's
        backend = _byte_level_bpe(merges)
        vocab = backend.get_vocab()
        vocab["ab"], vocab["abc"] = vocab["abc"], vocab["ab"]
        backend.model = models.BPE(vocab=vocab, merges=merges)
    elif change == "a token no merge makes":
        backend = _byte_level_bpe(merges)
        backend.add_tokens(["xyz"])  # an added token is fine ...
        assert FastByteLevelBpe.from_tokenizer(backend) is not None
        backend.model = models.BPE(vocab={**backend.get_vocab(), "zz": len(backend.get_vocab())}, merges=merges)
    elif change == "wordpiece":
        backend = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    else:
        backend = _byte_level_bpe(merges)
        backend.normalizer = normalizers.NFKC()
    with caplog.at_level("INFO"):
        assert FastByteLevelBpe.from_tokenizer(backend) is None
    assert REASONS[change] in caplog.text


def test_without_tiktoken_the_tokenizer_is_used(backend, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "tiktoken", None)
    with caplog.at_level("INFO"):
        assert FastByteLevelBpe.from_tokenizer(backend) is None
    assert "tiktoken is not installed" in caplog.text
