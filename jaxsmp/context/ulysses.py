"""Ulysses (DeepSpeed) attention over the ``cp`` axis.

Called inside a ``shard_map`` manual over ``cp``: an all-to-all turns sequence-split q, k,
v ``[b, s/cp, h, d]`` into head-split ones ``[b, s, h/cp, d]``, attention runs unchanged
on whole sequences (any kernel: cuDNN, Pallas, blockwise, reference), and an all-to-all
turns the output back. The sequence arrives in the balanced order of :mod:`.layout`; the
kernel sees it in the model's order (a local permutation after the all-to-all). Needs
the query heads on each device divisible by ``cp``; grouped key/value heads that ``cp``
does not divide are repeated to one per query head first (exact; the all-to-all of k
and v then moves as many bytes as q's). Autodiff transposes each all-to-all into the
reverse one.
"""
from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from jaxsmp.context.layout import balance, unbalance

AXIS = "cp"


def _local_heads(heads: int, tp: int) -> int:
    """Query heads per ``tp`` device (all of them where ``tp`` splits the batch instead)."""
    return heads // tp if heads % tp == 0 else heads


def fits(heads: int, cp: int, tp: int = 1) -> bool:
    """Whether ``cp`` divides the query heads each ``tp`` device holds."""
    return _local_heads(heads, tp) % cp == 0


def check_heads(heads: int, cp: int, tp: int = 1) -> None:
    """A clear error unless ``cp`` divides the query heads each ``tp`` device holds."""
    if not fits(heads, cp, tp):
        local = _local_heads(heads, tp)
        raise ValueError(
            f"context_parallel='ulysses' splits heads over cp={cp}, but each tp device "
            f"holds {local} query heads ({heads} / tp={tp}), not divisible by {cp}; use "
            f"context_parallel='ring' or a cp dividing {local}")


def to_heads(x: jax.Array) -> jax.Array:
    """[b, s/cp, h, d] sequence-split -> [b, s, h/cp, d] head-split."""
    return lax.all_to_all(x, AXIS, split_axis=2, concat_axis=1, tiled=True)


def to_sequence(x: jax.Array) -> jax.Array:
    """The inverse of :func:`to_heads`."""
    return lax.all_to_all(x, AXIS, split_axis=1, concat_axis=2, tiled=True)


def ulysses_attention(kernel: Callable[..., jax.Array], q: jax.Array, k: jax.Array,
                      v: jax.Array, alibi_slopes: jax.Array | None = None,
                      segment_ids: jax.Array | None = None, **kwargs) -> jax.Array:
    """``kernel(q, k, v, **kwargs)`` on whole sequences of this device's ``h/cp`` heads.
    ALiBi slopes are sliced to those heads; segment ids are gathered over the sequence."""
    cp, r = lax.axis_size(AXIS), lax.axis_index(AXIS)
    extra = {}
    if alibi_slopes is not None:
        h = alibi_slopes.shape[0] // cp
        extra["alibi_slopes"] = lax.dynamic_slice_in_dim(alibi_slopes, r * h, h)
    if segment_ids is not None:
        extra["segment_ids"] = unbalance(lax.all_gather(segment_ids, AXIS, axis=1, tiled=True),
                                         cp)
    if k.shape[2] % cp:  # grouped heads cp does not divide: one per query head
        k, v = (jnp.repeat(x, q.shape[2] // k.shape[2], axis=2) for x in (k, v))
    whole = [unbalance(to_heads(x), cp) for x in (q, k, v)]
    return to_sequence(balance(kernel(*whole, **extra, **kwargs), cp))
