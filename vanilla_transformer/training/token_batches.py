"""Token-budget batches (§5.1): pairs of similar length packed so that a batch holds about N source and N target
tokens, the paper's batching, which the stock Trainer cannot build; sharded across ranks deterministically and flat
in memory at millions of pairs."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler


def _packing_windows(lengths) -> tuple[int, Callable[[int, int], np.ndarray]]:
    """`lengths` as (count, window): `window(start, stop)` is `lengths[start:stop]` as int64. `lengths` is an array, or
    run lengths `(values, counts)` (value i repeated counts[i] times) so that millions of pairs need no array."""
    if isinstance(lengths, tuple):
        values, counts = (np.asarray(part, dtype=np.int64) for part in lengths)
        ends = np.cumsum(counts)

        def window(start: int, stop: int) -> np.ndarray:
            first, last = np.searchsorted(ends, [start, stop - 1], side="right")
            repeats = counts[first : last + 1].copy()  # (runs) pairs of each run inside [start, stop)
            repeats[0] = min(int(ends[first]), stop) - start
            if last > first:
                repeats[-1] = stop - int(ends[last - 1])
            return np.repeat(values[first : last + 1], repeats)

        return int(ends[-1]) if len(ends) else 0, window
    lengths = np.asarray(lengths)
    return len(lengths), lambda start, stop: lengths[start:stop].astype(np.int64)


def pack_token_batches(lengths, max_tokens: int, max_sentences: int | None = None) -> np.ndarray:
    """Greedy token-budget packing of pairs taken in the given order: a batch grows while `(size + 1) · longest` stays
    within `max_tokens` (and `size < max_sentences`), where `longest` is the longest `lengths` entry in it; then the
    next batch opens. Returns the batches' boundaries: batch b is positions `bounds[b]:bounds[b + 1]`. `lengths` is an
    array or run lengths `(values, counts)`.

    The loop runs once per batch, not per pair: from a batch's first pair, `n · running max` over a window of the
    next pairs is non-decreasing in n, so one `searchsorted` finds where the budget is exceeded (the window doubles
    until it holds the end of the batch).
    """
    total, window_of = _packing_windows(lengths)
    bounds, start, window = [0], 0, 64
    while start < total:
        while True:
            stop = min(total, start + window)
            longest = np.maximum.accumulate(window_of(start, stop))
            padded = longest * np.arange(1, stop - start + 1)  # (size) tokens of a batch of `size` pairs, padded
            size = int(np.searchsorted(padded, max_tokens, side="right"))
            if max_sentences is not None:
                size = min(size, max_sentences)
            if size < stop - start or stop == total:
                break
            window *= 2
        size = max(size, 1)  # a pair longer than the budget alone is refused by the sampler before packing
        start += size
        bounds.append(start)
        window = max(64, 2 * size)
    return np.asarray(bounds, dtype=np.int64)


def _length_blocks(source_lengths, target_lengths, block: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(offset, source, target) blocks of `block` pairs. Arrow columns (`length_columns`) are sliced without copying
    and only one block at a time becomes a numpy array, so no copy of a whole column is made."""
    for offset in range(0, len(source_lengths), block):
        yield (
            offset,
            *(
                np.asarray(
                    column.slice(offset, block) if hasattr(column, "chunks") else column[offset : offset + block]
                )
                for column in (source_lengths, target_lengths)
            ),
        )


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Batches of pairs of similar length holding at most `max_tokens` source and `max_tokens` target tokens.

    Pairs are sorted by (source, target) length with random tie-breaking, packed greedily so that
    `len(batch) · longest source <= max_tokens` and the same for targets (padding counted, so the budget bounds
    memory), and the batch order is shuffled. Every rank builds the same global list from `seed + epoch` and takes
    batches `rank, rank + num_replicas, ...`, so ranks see distinct batches; the list is padded by wrapping around to a
    multiple of `num_replicas` so every rank runs the same number of steps (DDP needs that).

    Memory stays flat in corpus size. A corpus of more than `shard_size` pairs is split at random (from `seed`, the
    same split every epoch) into shards of at most `shard_size` pairs, as OpenNMT-py's buckets and tensor2tensor's
    shards do; each shard is sorted, packed and its batches shuffled on its own, and an epoch takes the shards in a
    random order, one at a time, building a shard's order only when its first batch is due. The lengths are read
    block by block (Arrow columns from `length_columns` stay memory-mapped), and the packing depends only on how many
    pairs each (source, target) length has in a shard, so the batch boundaries are computed once from those counts.
    Nothing is kept per pair of the corpus: only one shard's order at a time. A corpus of one shard (up to
    `shard_size` pairs) gets exactly the batches of one sort of the whole corpus.
    """

    shard_size = 1 << 21  # pairs sorted at once; a corpus of more pairs is split into shards
    block_size = 1 << 21  # pairs read from the length columns at once

    def __init__(
        self,
        source_lengths: Sequence[int],
        target_lengths: Sequence[int],
        max_tokens: int,
        num_replicas: int = 1,
        rank: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        max_sentences: int | None = None,
    ):
        source_lengths, target_lengths = (
            column if hasattr(column, "chunks") else np.asarray(column) for column in (source_lengths, target_lengths)
        )  # Arrow columns stay memory-mapped
        if len(source_lengths) != len(target_lengths) or any(
            getattr(c, "ndim", 1) != 1 for c in (source_lengths, target_lengths)
        ):
            raise ValueError("source_lengths and target_lengths must be 1-D and of equal length.")
        if len(source_lengths) == 0:
            raise ValueError("Cannot batch an empty dataset.")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, num_replicas={num_replicas}) (got {rank}).")
        self.source_lengths, self.target_lengths = source_lengths, target_lengths
        self.max_tokens, self.num_replicas, self.rank = max_tokens, num_replicas, rank
        self.shuffle, self.seed, self.max_sentences = shuffle, seed, max_sentences
        self.epoch = 0
        self.count = len(source_lengths)
        self.num_shards = -(-self.count // self.shard_size)
        # One pass over the lengths for the longest of each side, one for the (source, target) lengths that occur, one
        # for how many pairs of each a shard has. A key orders pairs as (source, target) does: source · width + target.
        longest_source = longest_target = 0
        for _, source, target in self._blocks():
            if source.min(initial=0) < 0 or target.min(initial=0) < 0:
                raise ValueError("Lengths must be non-negative.")
            longest_source = max(longest_source, int(source.max()))
            longest_target = max(longest_target, int(target.max()))
        longest = max(longest_source, longest_target)
        if longest > max_tokens:
            raise ValueError(
                f"max_tokens={max_tokens} is smaller than the longest sequence ({longest} tokens); raise --max_tokens "
                "or lower --max_source_length/--max_target_length."
            )
        self._width = longest_target + 1
        present = np.zeros((longest_source + 1) * self._width, dtype=bool)  # (keys) whether a pair has the key
        for _, source, target in self._blocks():
            present[self._keys(source, target)] = True
        keys = np.flatnonzero(present)
        counts = np.zeros(self.num_shards * len(keys), dtype=np.int64)  # (shards · keys present) pairs
        for _, source, target, shard in self._blocks_with_shards():
            counts += np.bincount(
                shard * len(keys) + np.searchsorted(keys, self._keys(source, target)), minlength=len(counts)
            )
        counts = counts.reshape(self.num_shards, len(keys))  # (shards, keys present)
        # Ties in (source, target) length have equal packing lengths, so every epoch has these batch boundaries.
        packing_lengths = np.maximum(keys // self._width, keys % self._width)
        self._bounds = [
            pack_token_batches((packing_lengths[row > 0], row[row > 0]), max_tokens, max_sentences) for row in counts
        ]  # per shard: batch b of the shard is positions bounds[b]:bounds[b + 1] of the shard's order
        self._num_batches = sum(len(bounds) - 1 for bounds in self._bounds)

    def _blocks(self) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        return _length_blocks(self.source_lengths, self.target_lengths, self.block_size)

    def _blocks_with_shards(self) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
        """(offset, source, target, shard) blocks: each pair's shard is `floor(u · shards)` with u the pair's draw of
        `Generator([seed, 2**32 - 1]).random(count)` (all 0 for one shard), the same split every epoch."""
        draws = np.random.default_rng([self.seed, 2**32 - 1])
        for offset, source, target in self._blocks():
            if self.num_shards == 1:
                shard = np.zeros(len(source), dtype=np.int64)
            else:
                shard = (draws.random(len(source)) * self.num_shards).astype(np.int64)
            yield offset, source, target, shard

    def _keys(self, source: np.ndarray, target: np.ndarray) -> np.ndarray:
        return source.astype(np.int64) * self._width + target

    def set_epoch(self, epoch: int) -> None:
        """Reshuffle for `epoch` (the Trainer calls this before each epoch)."""
        self.epoch = epoch

    def shard_order(self, shard: int) -> tuple[np.ndarray, np.random.Generator]:
        """The shard's pairs sorted by (source length, target length, tie-break), where the tie-break is the pair's
        draw of `Generator([seed, epoch]).random(count)` (index order when not shuffling); with the generator after
        the whole stream. For one shard this is `np.lexsort((tie_break, target, source))` over the corpus. One pass
        over the lengths; the memory is the shard's."""
        ties = np.random.default_rng([self.seed, self.epoch])
        picked, picked_keys, picked_ties = [], [], []
        for offset, source, target, shards in self._blocks_with_shards():
            block_ties = ties.random(len(source)) if self.shuffle else None
            inside = np.flatnonzero(shards == shard)
            picked.append((inside + offset).astype(np.int32 if self.count < 2**31 else np.int64))
            picked_keys.append(self._keys(source[inside], target[inside]))
            if block_ties is not None:
                picked_ties.append(block_ties[inside])
        picked = np.concatenate(picked)
        sort_keys = (np.concatenate(picked_ties),) if self.shuffle else ()
        return picked[np.lexsort((*sort_keys, np.concatenate(picked_keys)))], ties

    def _epoch(self) -> Iterator[np.ndarray]:
        """The current epoch's global batches (pair indices), before padding: the shards in a random order
        (`Generator([seed, epoch, 1])`), each shard's batches in a random order drawn from the generator after the
        tie-break stream. Each shard's order is built when its first batch is due."""
        shards = np.arange(self.num_shards)
        if self.shuffle and self.num_shards > 1:
            shards = np.random.default_rng([self.seed, self.epoch, 1]).permutation(self.num_shards)
        rng = None
        for shard in shards.tolist():
            order, after = self.shard_order(shard)
            rng = after if rng is None else rng
            bounds = self._bounds[shard]
            ids = rng.permutation(len(bounds) - 1) if self.shuffle else np.arange(len(bounds) - 1)
            for i in ids.tolist():
                yield order[bounds[i] : bounds[i + 1]]

    def _padded_epoch(self) -> Iterator[np.ndarray]:
        """`_epoch`, then its first batches again until the count is a multiple of `num_replicas`."""
        padding = -self._num_batches % self.num_replicas
        first = []
        for batch in self._epoch():
            if len(first) < padding:
                first.append(batch)
            yield batch
        yield from first

    def global_batches(self) -> list[list[int]]:
        """All ranks' batches for the current epoch, in order, padded to a multiple of `num_replicas`."""
        return [batch.tolist() for batch in self._padded_epoch()]

    def __iter__(self) -> Iterator[list[int]]:
        for position, batch in enumerate(self._padded_epoch()):
            if position % self.num_replicas == self.rank:
                yield batch.tolist()

    def __len__(self) -> int:
        return math.ceil(self._num_batches / self.num_replicas)


def length_columns(dataset, columns: Sequence[str] = ("source_length", "target_length")) -> list:
    """Integer columns of a `datasets.Dataset` as Arrow `ChunkedArray`s: views of its table, so the columns of a
    memory-mapped dataset stay on disk (the sampler reads them a block at a time)."""
    missing = [column for column in columns if column not in dataset.column_names]
    if missing:
        raise ValueError(f"Token batching needs a {missing[0]!r} column; tokenize with pair_encoding.tokenize_pairs.")
    table = dataset.with_format("arrow", columns=list(columns))[:]
    return [table.column(column) for column in columns]
