"""Byte-level BPE at tiktoken's speed, with the tokenizer's own ids (paper §5.1's data at the scale of millions).

Preparing a corpus is bound by the tokenizer: a byte-level BPE tokenizer of `tokenizers` (GPT-2's scheme, the one
`train_bpe_tokenizer` trains) spends most of its time in its pre-tokenizer and in building an `Encoding` per text.
tiktoken runs the same scheme (the same split pattern, then merges by rank within each piece) several times faster
and returns plain ids. The two give the same ids on a text when

1. the vocabulary is the closure of its merges: every token other than the 256 byte symbols and the added tokens is
   the product of exactly one merge, and the products' ids grow with their merges' ranks. Then the pair `tokenizers`
   merges first (the lowest merge rank) is the pair tiktoken merges first (the lowest product id), as long as no
   adjacent pair of tokens joins into a token by a split other than its merge;
2. `tokenizers`' BPE gives every product back as itself. tiktoken takes a piece that is a whole token as it is;
   and if two adjacent tokens joined into a token `t` by another split, they would be a state of `t`'s own merges
   (every merge that built them lay inside `t`), from which those merges, ending at `t`, can only go on by `t`'s
   merge. So no such pair ever meets, and 1. holds on every text;
3. the text holds no added token: `tokenizers` splits those off before its pre-tokenizer, so such a text goes through
   the tokenizer itself.

`FastByteLevelBpe.from_tokenizer` checks 1 and 2 on the whole vocabulary and returns None for any other tokenizer
(another model, a normalizer, BPE dropout, ...), whose texts then go through `tokenizers` as before. The split
pattern is GPT-2's in both; their regex engines agree on the letter, number and space classes of every Unicode code
point (tests/test_byte_level_bpe.py: every seventh, and all of them under `-m slow`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from transformers.utils import logging

logger = logging.get_logger(__name__)

# GPT-2's split pattern, as `tokenizers`' ByteLevel pre-tokenizer (use_regex=True) writes it.
SPLIT_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


class FastByteLevelBpe:
    """`encode(texts)` gives what the tokenizer's backend gives (`Encoding.ids`, special tokens included), through
    tiktoken. Picklable: the tiktoken encoding is built again where it is first used (each `datasets.map` worker)."""

    def __init__(
        self, ranks: dict[bytes, int], prefix_space: bool, before: list[int], after: list[int], backend: Any
    ):  # fmt: skip
        self.ranks, self.prefix_space = ranks, prefix_space
        self.before, self.after = before, after
        self.backend = backend  # the tokenizer's own backend, for the texts that hold an added token
        added = [token.content for token in backend.get_added_tokens_decoder().values()]
        self._added = re.compile("|".join(map(re.escape, added))) if added else None
        self._encoding = None

    @classmethod
    def from_tokenizer(cls, backend: Any) -> FastByteLevelBpe | None:
        """For a `tokenizers.Tokenizer` (without truncation and padding) whose ids tiktoken reproduces; else None,
        with the reason logged."""
        try:
            import tiktoken  # noqa: F401
        except ImportError:
            logger.info("tiktoken is not installed; tokenizing through `tokenizers` (pip install tiktoken).")
            return None
        spec = json.loads(backend.to_str())
        try:
            ranks, template = _equivalent_ranks(spec, backend)
        except ValueError as reason:
            logger.info(f"Tokenizing through `tokenizers`: {reason}")
            return None
        prefix_space = bool(spec["pre_tokenizer"].get("add_prefix_space", False))
        return cls(ranks, prefix_space, *template, backend=backend)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_encoding": None}

    def _tiktoken(self):
        if self._encoding is None:
            import tiktoken

            self._encoding = tiktoken.Encoding(
                "vanilla-transformer", pat_str=SPLIT_PATTERN, mergeable_ranks=self.ranks, special_tokens={}
            )
        return self._encoding

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, the tokenizer's special tokens (e.g. the final `</s>`) included."""
        encode, before, after = self._tiktoken().encode_ordinary, self.before, self.after
        pieces = texts
        if self.prefix_space:  # as the ByteLevel pre-tokenizer: a space before a text that does not begin with one
            pieces = [text if text.startswith(" ") else " " + text for text in texts]
        ids = [before + encode(piece) + after for piece in pieces]
        if self._added is not None:
            holding = [i for i, text in enumerate(texts) if self._added.search(text)]
            if holding:
                for i, encoding in zip(holding, self.backend.encode_batch([texts[i] for i in holding]), strict=True):
                    ids[i] = encoding.ids
        return ids


def _equivalent_ranks(spec: dict[str, Any], backend: Any) -> tuple[dict[bytes, int], tuple[list[int], list[int]]]:
    """tiktoken's ranks (token bytes to id) and the ids around a text, for a tokenizer that meets the module's
    conditions; a ValueError saying which one fails otherwise."""
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    if model.get("type") != "BPE":
        raise ValueError(f"a {model.get('type')} model, not BPE")
    if spec.get("normalizer") is not None:
        raise ValueError("the tokenizer has a normalizer")
    if pre.get("type") != "ByteLevel" or not pre.get("use_regex", True):
        raise ValueError("the pre-tokenizer is not byte-level with GPT-2's split pattern")
    if model.get("dropout") or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise ValueError("BPE with dropout or a subword prefix or suffix")
    if model.get("byte_fallback") or model.get("ignore_merges"):
        raise ValueError("BPE with byte fallback or ignore_merges")
    template = _template(spec.get("post_processor"))
    vocab: dict[str, int] = model["vocab"]
    added = {token["content"] for token in spec.get("added_tokens", [])}
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = {symbol: byte for byte, symbol in bytes_to_unicode().items()}  # GPT-2's printable stand-ins
    if any(symbol not in vocab for symbol in symbols):
        raise ValueError("a byte symbol is missing from the vocabulary")
    products, last = set(), -1
    for merge in model.get("merges", []):
        left, right = merge if isinstance(merge, list) else merge.split(" ", 1)
        product = left + right
        token_id = vocab.get(product)
        if token_id is None or token_id <= last or product in products:
            raise ValueError(f"the merge {left!r} + {right!r} does not make the next token of the vocabulary")
        products.add(product)
        last = token_id
    if set(vocab) - added - set(symbols) != products:
        raise ValueError("the vocabulary holds tokens that no merge makes")
    for product in products:
        tokens = backend.model.tokenize(product)
        if len(tokens) != 1:
            raise ValueError(f"BPE splits its own token {product!r}")
    ranks = {bytes(symbols[c] for c in token): i for token, i in vocab.items() if token not in added}
    return ranks, template


def _template(post_processor: dict[str, Any] | None) -> tuple[list[int], list[int]]:
    """The special-token ids a single text gets before and after its own (a TemplateProcessing of `$A`)."""
    if post_processor is None:
        return [], []
    if post_processor.get("type") != "TemplateProcessing":
        raise ValueError(f"a {post_processor.get('type')} post-processor")
    before, after, seen = [], [], False
    for item in post_processor["single"]:
        if "Sequence" in item:
            seen = True
            continue
        ids = post_processor["special_tokens"][item["SpecialToken"]["id"]]["ids"]
        (after if seen else before).extend(ids)
    return before, after
