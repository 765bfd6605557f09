"""Memory-mapped token shards (written by :mod:`jaxsmp.data.prepare`) served as
packed, shuffled batches.

A split of ``n`` tokens holds ``n // seq_len`` rows: consecutive windows of
``seq_len`` tokens, packed across document boundaries. Epoch ``e`` visits the rows
in a permutation drawn from ``(seed, e)``; batch ``i`` takes positions
``i*batch_size .. (i+1)*batch_size - 1`` of that endless sequence. A batch is thus
a function of (seed, i) alone: a run resumed at step ``i`` sees the batches the
uninterrupted run would have seen, and each host reads only the rows it asks for.
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np

INDEX = "index.json"
FORMAT = "jaxsmp-tokens/1"


def is_prepared(path: str | os.PathLike | None) -> bool:
    """Whether ``path`` is a directory written by :mod:`jaxsmp.data.prepare`."""
    return path is not None and (Path(path) / INDEX).is_file()


class TokenDataset:
    """The token shards of a prepared directory, memory-mapped (nothing is read
    until rows are asked for)."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        if not is_prepared(directory):
            raise ValueError(f"{directory} is not a prepared dataset (no {INDEX}); "
                             f"write one with python -m jaxsmp.data.prepare")
        self.index = json.loads((self.directory / INDEX).read_text())
        if self.index.get("format") != FORMAT:
            raise ValueError(f"{self.directory / INDEX} has format "
                             f"{self.index.get('format')!r}; this jaxsmp reads {FORMAT!r}")
        dtype = np.dtype(self.index["dtype"])
        self.shards = [np.memmap(self.directory / s["file"], dtype, mode="r", shape=(s["tokens"],))
                       for s in self.index["shards"]]
        self.offsets = np.cumsum([0] + [s["tokens"] for s in self.index["shards"]])

    @property
    def tokenizer(self) -> dict:
        """The identity of the tokenizer the shards were written with."""
        return self.index["tokenizer"]

    @property
    def vocab_size(self) -> int:
        return self.index["tokenizer"]["vocab_size"]

    def split(self, name: str) -> tuple[int, int]:
        """``(start, stop)`` token offsets of split ``name`` (``train`` or ``val``)."""
        splits = self.index["splits"]
        if name not in splits:
            raise ValueError(f"unknown split {name!r}; {self.directory} has {sorted(splits)}")
        return tuple(splits[name])

    def read(self, start: int, length: int) -> np.ndarray:
        """Tokens ``start .. start+length-1`` of the stream, across shard boundaries."""
        parts, end = [], start + length
        first = int(np.searchsorted(self.offsets, start, side="right")) - 1
        for k in range(first, len(self.shards)):
            lo, hi = max(start, self.offsets[k]), min(end, self.offsets[k + 1])
            if lo >= hi:
                break
            parts.append(self.shards[k][lo - self.offsets[k]:hi - self.offsets[k]])
        out = np.concatenate(parts) if len(parts) > 1 else np.array(parts[0])
        return out.astype(np.int32)


class PackedBatches:
    """Shuffled ``[batch_size, seq_len]`` batches of one split of a :class:`TokenDataset`."""

    def __init__(self, dataset: TokenDataset, split: str, batch_size: int, seq_len: int,
                 seed: int = 0):
        self.dataset, self.batch_size, self.seq_len, self.seed = dataset, batch_size, seq_len, seed
        self.start, stop = dataset.split(split)
        self.rows_per_epoch = (stop - self.start) // seq_len
        if self.rows_per_epoch < 1:
            raise ValueError(f"the {split} split of {dataset.directory} has {stop - self.start} "
                             f"tokens, fewer than seq_len={seq_len}")
        self._permutation = lru_cache(maxsize=2)(self._epoch_permutation)

    def _epoch_permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng((self.seed, epoch)).permutation(self.rows_per_epoch)

    def row_ids(self, index: int, positions: Sequence[int]) -> np.ndarray:
        """Dataset rows at ``positions`` (0 .. batch_size-1) of batch ``index``."""
        sample = index * self.batch_size + np.asarray(positions, np.int64)
        epochs, within = np.divmod(sample, self.rows_per_epoch)
        return np.asarray([self._permutation(int(e))[w] for e, w in zip(epochs, within)], np.int64)

    def rows(self, index: int, positions: Sequence[int]) -> np.ndarray:
        """``int32[len(positions), seq_len]``: only these rows of batch ``index`` are read."""
        ids = self.row_ids(index, positions)
        return np.stack([self.dataset.read(self.start + r * self.seq_len, self.seq_len)
                         for r in ids]) if len(ids) else np.zeros((0, self.seq_len), np.int32)

    def batch(self, index: int) -> dict[str, np.ndarray]:
        """The whole global batch ``index`` on this host."""
        return {"tokens": self.rows(index, range(self.batch_size))}
