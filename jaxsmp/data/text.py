"""Offline text corpora and step-indexed random batches of an in-memory token array.

The default corpus is the Python reference documentation that every CPython
install ships (``pydoc_data.topics``, ~460 KB of English prose and code), so the
examples train on real text with no download.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np


def default_corpus() -> str:
    """The Python reference documentation's topics, joined (real text, always offline)."""
    from pydoc_data.topics import topics
    return "\n\n".join(topics[k] for k in sorted(topics))


def load_corpus(path: str | None) -> str:
    """The text at ``path`` (a file, or a directory of ``*.txt``), or the default corpus."""
    if path is None:
        return default_corpus()
    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("*.txt"))
        if not files:
            raise ValueError(f"data directory {path!r} has no *.txt files")
        return "\n\n".join(f.read_text(encoding="utf-8", errors="replace") for f in files)
    if not p.is_file():
        raise ValueError(f"data path {path!r} is neither a file nor a directory")
    return p.read_text(encoding="utf-8", errors="replace")


@dataclass
class TokenBatches:
    """Random windows of ``seq_len`` tokens; batch ``i`` depends only on (seed, i),
    so a resumed run sees exactly the batches it would have seen."""
    tokens: np.ndarray
    batch_size: int
    seq_len: int
    seed: int = 0

    def __post_init__(self) -> None:
        if len(self.tokens) <= self.seq_len:
            raise ValueError(f"corpus of {len(self.tokens)} tokens is shorter than "
                             f"seq_len={self.seq_len}")

    def rows(self, index: int, positions: Sequence[int]) -> np.ndarray:
        """``int32[len(positions), seq_len]``: rows ``positions`` of batch ``index``."""
        rng = np.random.default_rng((self.seed, index))
        starts = rng.integers(0, len(self.tokens) - self.seq_len, self.batch_size)[list(positions)]
        return np.stack([self.tokens[s:s + self.seq_len] for s in starts]).astype(np.int32)

    def batch(self, index: int) -> dict[str, np.ndarray]:
        """The whole global batch ``index``."""
        return {"tokens": self.rows(index, range(self.batch_size))}

    def split(self, eval_fraction: float = 0.1) -> tuple[TokenBatches, TokenBatches]:
        """Train and held-out batches from disjoint parts of the corpus."""
        cut = int(len(self.tokens) * (1 - eval_fraction))
        make = lambda t, s: TokenBatches(t, self.batch_size, self.seq_len, s)
        return make(self.tokens[:cut], self.seed), make(self.tokens[cut:], self.seed + 1)
