"""Zero padding that lets the Pallas kernels take any head dim and sequence length.

Triton tiles need power-of-two sizes: the head dim is padded with zeros to the next of
:data:`HEAD_DIMS` (zeros change no score ``q . k`` and give zero output columns), the
sequence to a multiple of the tile. Padded keys are masked: under a causal mask they
come after every real query; otherwise they get a segment id no real token has.
Padded query rows are cut off, so their cotangents are zero and they add nothing to
any gradient (dS = P * (dO V^T - rowsum(dO * O)) = 0 on those rows).
"""
from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

HEAD_DIMS = (16, 32, 64, 128, 256)
PAD_SEGMENT = jnp.iinfo(jnp.int32).min  # the segment id of padded positions


def padded_head_dim(head_dim: int) -> int:
    for d in HEAD_DIMS:
        if head_dim <= d:
            return d
    raise ValueError(f"impl 'pallas' supports head dims up to {HEAD_DIMS[-1]}, got {head_dim}")


def _pad(x: jax.Array, axis: int, to: int, value=0) -> jax.Array:
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, to - x.shape[axis])
    return jnp.pad(x, widths, constant_values=value) if to > x.shape[axis] else x


def pad_for_pallas(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array | None, *,
                   causal: bool, multiple: int) -> tuple[tuple, Callable[[jax.Array], jax.Array]]:
    """((q, k, v, segment_ids) padded, a function cutting the output back to q's shape)."""
    b, seq, _, head_dim = q.shape
    dim = padded_head_dim(head_dim)
    length = -(-seq // multiple) * multiple
    q, k, v = (_pad(_pad(x, 3, dim), 1, length) for x in (q, k, v))
    if length > seq and (segment_ids is not None or not causal):
        ids = jnp.zeros((b, seq), jnp.int32) if segment_ids is None else segment_ids
        segment_ids = _pad(ids, 1, length, PAD_SEGMENT)

    def unpad(out: jax.Array) -> jax.Array:
        return out[:, :seq, :, :head_dim]
    return (q, k, v, segment_ids), unpad
