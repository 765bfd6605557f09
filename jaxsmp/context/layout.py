"""The load-balanced sequence order of context parallelism (what ring attention needs;
Ulysses permutes back locally after its all-to-all).

The sequence is cut into ``2·cp`` chunks; device ``r`` holds chunks ``r`` and
``2·cp-1-r``, so under a causal mask every device has as many unmasked (query, key)
pairs as every other (with contiguous chunks the last device would do ``2·cp-1`` times
the first one's work). :func:`balance` puts a ``[batch, seq, ...]`` array in that order
(then a contiguous split over ``cp`` gives each device its two chunks);
:func:`unbalance` is its exact inverse (a permutation, no arithmetic).
"""
from __future__ import annotations

import jax
import numpy as np


def order(cp: int) -> np.ndarray:
    """Chunk indices in the balanced order: ``[0, 2cp-1, 1, 2cp-2, ...]``."""
    return np.stack([np.arange(cp), 2 * cp - 1 - np.arange(cp)], axis=1).reshape(-1)


def _permute(x: jax.Array, cp: int, chunks: np.ndarray) -> jax.Array:
    b, s = x.shape[:2]
    if s % (2 * cp):
        raise ValueError(f"context parallelism splits the sequence into 2*cp = {2 * cp} chunks, "
                         f"but the sequence length is {s}; use a multiple of {2 * cp}")
    parts = x.reshape(b, 2 * cp, s // (2 * cp), *x.shape[2:])
    return parts[:, chunks].reshape(x.shape)


def balance(x: jax.Array, cp: int) -> jax.Array:
    """``x`` ``[batch, seq, ...]`` in the balanced order."""
    return _permute(x, cp, order(cp))


def unbalance(x: jax.Array, cp: int) -> jax.Array:
    """The inverse of :func:`balance`."""
    return _permute(x, cp, np.argsort(order(cp)))


def unmasked_pairs(seq: int, cp: int, balanced: bool) -> list[int]:
    """Causal (query, key) pairs each device's queries attend to, contiguous or balanced."""
    position = np.arange(seq)
    if balanced:
        position = position.reshape(2 * cp, -1)[order(cp)].reshape(-1)
    per_device = position.reshape(cp, -1)
    return [int((q + 1).sum()) for q in per_device]  # query at position p sees p + 1 keys
