"""Scores of one (query block, key block) tile inside a Pallas kernel: scale, ALiBi, masks."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

# Finite stand-in for -inf: a fully masked tile then gives exp(0) terms that the online
# softmax rescales to zero once a real key is seen, instead of NaNs from (-inf) - (-inf).
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)


def dot_nt(a: jax.Array, b: jax.Array) -> jax.Array:
    """a @ b.T accumulated in float32."""
    return lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def dot_tn(a: jax.Array, b: jax.Array) -> jax.Array:
    """a.T @ b accumulated in float32."""
    return lax.dot_general(a, b, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def dot_nn(a: jax.Array, b: jax.Array) -> jax.Array:
    """a @ b accumulated in float32."""
    return lax.dot_general(a, b, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def block_scores(q: jax.Array, k: jax.Array, *, scale: float, q_start: jax.Array,
                 k_start: jax.Array, causal: bool, slope: jax.Array | None,
                 q_segments: jax.Array | None, k_segments: jax.Array | None) -> jax.Array:
    """float32 [block_q, block_k] scores ``q k^T * scale + slope * (k_pos - q_pos)``, masked."""
    block_q, block_k = q.shape[0], k.shape[0]
    s = dot_nt(q, k) * scale
    q_pos = q_start + lax.broadcasted_iota(jnp.int32, (block_q, block_k), 0)
    k_pos = k_start + lax.broadcasted_iota(jnp.int32, (block_q, block_k), 1)
    if slope is not None:
        s = s + slope.astype(jnp.float32) * (k_pos - q_pos).astype(jnp.float32)
    mask = None
    if causal:
        mask = q_pos >= k_pos
    if q_segments is not None:
        same = q_segments[:, None] == k_segments[None, :]
        mask = same if mask is None else mask & same
    if mask is not None:
        s = jnp.where(mask, s, MASK_VALUE)
    return s


def key_block_scores(q: jax.Array, k_ref, v_ref, seg_ref, kb: jax.Array, *, block_k: int,
                     scale: float, q_start: jax.Array, causal: bool,
                     slope: jax.Array | None, q_segments: jax.Array | None
                     ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(k, v, scores) of key block ``kb``: its rows of ``k_ref``/``v_ref`` and the
    :func:`block_scores` of ``q`` against them."""
    k_start = kb * block_k
    k = k_ref[pl.ds(k_start, block_k), :]
    v = v_ref[pl.ds(k_start, block_k), :]
    k_segments = None if seg_ref is None else seg_ref[pl.ds(k_start, block_k)]
    s = block_scores(q, k, scale=scale, q_start=q_start, k_start=k_start, causal=causal,
                     slope=slope, q_segments=q_segments, k_segments=k_segments)
    return k, v, s


def num_key_blocks(q_start: jax.Array, *, block_q: int, block_k: int, seq_len: int,
                   causal: bool) -> jax.Array:
    """Key blocks a query block starting at ``q_start`` visits, as int32 (also under
    ``jax_enable_x64``); causal runs stop at the diagonal block."""
    if not causal:
        return jnp.int32(seq_len // block_k)
    start = jnp.asarray(q_start).astype(jnp.int32)
    return lax.div(start + jnp.int32(block_q + block_k - 1), jnp.int32(block_k))


def unmasked_key_blocks(q_start: jax.Array, *, block_k: int) -> jax.Array:
    """Key blocks whose every key precedes a query block starting at ``q_start`` (the
    causal mask leaves them whole: their scores skip it), as int32."""
    start = jnp.asarray(q_start).astype(jnp.int32)
    return lax.div(start + jnp.int32(1), jnp.int32(block_k))


def first_unmasked_query_block(k_start: jax.Array, *, block_q: int, block_k: int,
                               num_q_blocks: int) -> jax.Array:
    """The first query block whose every query follows a key block starting at
    ``k_start`` (from it on the causal mask leaves the tiles whole), as int32."""
    last_key = jnp.asarray(k_start).astype(jnp.int32) + jnp.int32(block_k - 1)
    first = lax.div(last_key + jnp.int32(block_q - 1), jnp.int32(block_q))
    return jnp.minimum(first, jnp.int32(num_q_blocks))
