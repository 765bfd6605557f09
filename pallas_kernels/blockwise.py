"""Blockwise attention in plain XLA: the FlashAttention algorithm as loops over tiles.

Queries are processed block by block; each query block runs an online softmax over key
blocks. The custom VJP saves only the output and log-sum-exp and recomputes the tiles, so
memory is linear in sequence length. Causal runs stop at the diagonal key block.
K/V are never repeated for GQA: queries are viewed as [batch, seq, kv_heads, groups, dim].
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels.block_scores import MASK_VALUE, num_key_blocks
from pallas_kernels.vma import match_vma


def _tile_scores(q: jax.Array, k: jax.Array, *, scale: float, q_start: jax.Array,
                 k_start: jax.Array, causal: bool, slopes: jax.Array | None,
                 q_segments: jax.Array | None, k_segments: jax.Array | None) -> jax.Array:
    """q [b, bq, kvh, g, d], k [b, bk, kvh, d] -> masked float32 scores [b, kvh, g, bq, bk]."""
    s = jnp.einsum("bqhgd,bkhd->bhgqk", q, k, preferred_element_type=jnp.float32) * scale
    q_pos = q_start + jnp.arange(q.shape[1])[:, None]
    k_pos = k_start + jnp.arange(k.shape[1])[None, :]
    if slopes is not None:
        s = s + slopes[None, :, :, None, None] * (k_pos - q_pos).astype(jnp.float32)
    mask = None
    if causal:
        mask = q_pos >= k_pos
    if q_segments is not None:
        same = (q_segments[:, :, None] == k_segments[:, None, :])[:, None, None]
        mask = same if mask is None else mask & same
    return s if mask is None else jnp.where(mask, s, MASK_VALUE)


def _slice(x: jax.Array | None, start: jax.Array, size: int, axis: int) -> jax.Array | None:
    return None if x is None else lax.dynamic_slice_in_dim(x, start, size, axis)


def forward(q5, k, v, slopes, segment_ids, scale, causal, block_q, block_k):
    """q5 [b, s, kvh, g, d] -> (out [b, kvh, g, s, d] float32, lse [b, kvh, g, s])."""
    b, seq_len, kvh, g, d = q5.shape
    tile = functools.partial(_tile_scores, scale=scale, causal=causal, slopes=slopes)

    def query_block(qi):
        q_start = qi * block_q
        q = _slice(q5, q_start, block_q, 1)
        q_segments = _slice(segment_ids, q_start, block_q, 1)

        def key_block(ki, carry):
            acc, m, l = carry
            k_start = ki * block_k
            kb, vb = _slice(k, k_start, block_k, 1), _slice(v, k_start, block_k, 1)
            s = tile(q, kb, q_start=q_start, k_start=k_start, q_segments=q_segments,
                     k_segments=_slice(segment_ids, k_start, block_k, 1))
            m_new = jnp.maximum(m, s.max(-1))
            correction = jnp.exp(m - m_new)
            p = jnp.exp(s - m_new[..., None])
            l = correction * l + p.sum(-1)
            pv = jnp.einsum("bhgqk,bkhd->bhgqd", p.astype(v.dtype), vb,
                            preferred_element_type=jnp.float32)
            return correction[..., None] * acc + pv, m_new, l

        init = match_vma((jnp.zeros((b, kvh, g, block_q, d), jnp.float32),
                           jnp.full((b, kvh, g, block_q), -jnp.inf, jnp.float32),
                           jnp.zeros((b, kvh, g, block_q), jnp.float32)), q5, k, v)
        n = num_key_blocks(q_start, block_q=block_q, block_k=block_k, seq_len=seq_len,
                           causal=causal)
        acc, m, l = lax.fori_loop(0, n, key_block, init)
        return acc / l[..., None], m + jnp.log(l)

    outs, lses = lax.map(query_block, jnp.arange(seq_len // block_q))
    out = jnp.moveaxis(outs, 0, 3).reshape(b, kvh, g, seq_len, d)
    lse = jnp.moveaxis(lses, 0, 3).reshape(b, kvh, g, seq_len)
    return out, lse


def backward(q5, k, v, do5, lse, delta, slopes, segment_ids, scale, causal, block_q,
              block_k):
    """Gradients (dq5, dk, dv) in float32, unscaled dq/dk (the caller multiplies by scale)."""
    b, seq_len, kvh, g, d = q5.shape
    tile = functools.partial(_tile_scores, scale=scale, causal=causal, slopes=slopes)

    def query_block(qi, grads):
        dq, dk, dv = grads
        q_start = qi * block_q
        q, do = _slice(q5, q_start, block_q, 1), _slice(do5, q_start, block_q, 1)
        lse_q, delta_q = _slice(lse, q_start, block_q, 3), _slice(delta, q_start, block_q, 3)
        q_segments = _slice(segment_ids, q_start, block_q, 1)

        def key_block(ki, carry):
            dq_q, dk, dv = carry
            k_start = ki * block_k
            kb, vb = _slice(k, k_start, block_k, 1), _slice(v, k_start, block_k, 1)
            s = tile(q, kb, q_start=q_start, k_start=k_start, q_segments=q_segments,
                     k_segments=_slice(segment_ids, k_start, block_k, 1))
            p = jnp.exp(s - lse_q[..., None])
            dp = jnp.einsum("bqhgd,bkhd->bhgqk", do, vb, preferred_element_type=jnp.float32)
            ds = p * (dp - delta_q[..., None])
            dv_k = jnp.einsum("bhgqk,bqhgd->bkhd", p.astype(do.dtype), do,
                              preferred_element_type=jnp.float32)
            dk_k = jnp.einsum("bhgqk,bqhgd->bkhd", ds.astype(q.dtype), q,
                              preferred_element_type=jnp.float32)
            dq_q = dq_q + jnp.einsum("bhgqk,bkhd->bqhgd", ds.astype(k.dtype), kb,
                                     preferred_element_type=jnp.float32)
            dk = lax.dynamic_update_slice_in_dim(dk, _slice(dk, k_start, block_k, 1) + dk_k,
                                                 k_start, 1)
            dv = lax.dynamic_update_slice_in_dim(dv, _slice(dv, k_start, block_k, 1) + dv_k,
                                                 k_start, 1)
            return dq_q, dk, dv

        n = num_key_blocks(q_start, block_q=block_q, block_k=block_k, seq_len=seq_len,
                           causal=causal)
        init = (match_vma(jnp.zeros((b, block_q, kvh, g, d), jnp.float32), q5, k, v, do5),
                dk, dv)
        dq_q, dk, dv = lax.fori_loop(0, n, key_block, init)
        return lax.dynamic_update_slice_in_dim(dq, dq_q, q_start, 1), dk, dv

    grads = match_vma((jnp.zeros(q5.shape, jnp.float32), jnp.zeros(k.shape, jnp.float32),
                        jnp.zeros(v.shape, jnp.float32)), q5, k, v, do5)
    return lax.fori_loop(0, seq_len // block_q, query_block, grads)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8))
def blockwise_attention(q: jax.Array, k: jax.Array, v: jax.Array, slopes: jax.Array | None,
                        segment_ids: jax.Array | None, scale: float, causal: bool,
                        block_q: int, block_k: int) -> jax.Array:
    """Blockwise attention on validated inputs; slopes and segment ids get no gradient."""
    return _blockwise_fwd(q, k, v, slopes, segment_ids, scale, causal, block_q, block_k)[0]


def split_heads(q: jax.Array, kv_heads: int) -> jax.Array:
    b, s, h, d = q.shape
    return q.reshape(b, s, kv_heads, h // kv_heads, d)


def group_slopes(slopes: jax.Array | None, kv_heads: int) -> jax.Array | None:
    return None if slopes is None else slopes.astype(jnp.float32).reshape(kv_heads, -1)


def _blockwise_fwd(q, k, v, slopes, segment_ids, scale, causal, block_q, block_k):
    kv_heads = k.shape[2]
    out5, lse = forward(split_heads(q, kv_heads), k, v, group_slopes(slopes, kv_heads),
                         segment_ids, scale, causal, block_q, block_k)
    out = jnp.moveaxis(out5, 3, 1).reshape(q.shape).astype(q.dtype)
    return out, (q, k, v, slopes, segment_ids, out, lse)


def _blockwise_bwd(scale, causal, block_q, block_k, residuals, do):
    q, k, v, slopes, segment_ids, out, lse = residuals
    kv_heads = k.shape[2]
    delta = jnp.einsum("bshd,bshd->bhs", out.astype(jnp.float32), do.astype(jnp.float32))
    delta = delta.reshape(lse.shape)
    dq, dk, dv = backward(split_heads(q, kv_heads), k, v, split_heads(do, kv_heads), lse,
                           delta, group_slopes(slopes, kv_heads), segment_ids, scale, causal,
                           block_q, block_k)
    return ((dq * scale).reshape(q.shape).astype(q.dtype), (dk * scale).astype(k.dtype),
            dv.astype(v.dtype), None, None)


blockwise_attention.defvjp(_blockwise_fwd, _blockwise_bwd)
