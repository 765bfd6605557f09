"""Pallas FlashAttention backward kernels: dq (per query block) and dk/dv (per key block).

Both recompute probabilities from the saved log-sum-exp. The dk/dv kernel runs once per
*kv* head and loops over the query heads sharing it (GQA/MQA), so K/V are never repeated.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.block_scores import (
    block_scores,
    dot_nn,
    dot_nt,
    dot_tn,
    first_unmasked_query_block,
    key_block_scores,
    num_key_blocks,
    unmasked_key_blocks,
)
from pallas_kernels.flash_tuning import Launch, compiler_params
from pallas_kernels.vma import match_vma, out_struct


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, slope_ref, seg_ref, dq_ref, *,
               scale: float, causal: bool, block_q: int, block_k: int) -> None:
    seq_len, head_dim = k_ref.shape
    q_start = pl.program_id(2) * block_q
    q, do = q_ref[...], do_ref[...]
    lse, delta = lse_ref[...], delta_ref[...]
    slope = None if slope_ref is None else slope_ref[...]
    q_segments = None if seg_ref is None else seg_ref[pl.ds(q_start, block_q)]

    def body(masked: bool, kb, dq):
        k, v, s = key_block_scores(q, k_ref, v_ref, seg_ref, kb, block_k=block_k, scale=scale,
                                   q_start=q_start, causal=masked, slope=slope,
                                   q_segments=q_segments)
        p = jnp.exp(s - lse[:, None])
        ds = p * (dot_nt(do, v) - delta[:, None])
        return dq + dot_nn(ds.astype(k.dtype), k)

    num_k_blocks = num_key_blocks(q_start, block_q=block_q, block_k=block_k,
                                  seq_len=seq_len, causal=causal)
    whole = unmasked_key_blocks(q_start, block_k=block_k) if causal else num_k_blocks
    dq = lax.fori_loop(0, whole, functools.partial(body, False),
                       jnp.zeros((block_q, head_dim), jnp.float32))
    dq = lax.fori_loop(whole, num_k_blocks, functools.partial(body, causal), dq)
    dq_ref[...] = (dq * scale).astype(dq_ref.dtype)


def _dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, slope_ref, seg_ref,
                dk_ref, dv_ref, *, scale: float, causal: bool, block_q: int,
                block_k: int) -> None:
    seq_len, groups, head_dim = q_ref.shape
    k_start = pl.program_id(2) * block_k
    k, v = k_ref[...], v_ref[...]
    k_segments = None if seg_ref is None else seg_ref[pl.ds(k_start, block_k)]
    # Causal: query blocks ending before this key block's first row are fully masked.
    first_q_block = lax.div(k_start, jnp.int32(block_q)) if causal else jnp.int32(0)

    def q_block(g, masked, qb, carry):
        dk, dv = carry
        q_start = qb * block_q
        q = q_ref[pl.ds(q_start, block_q), g, :]
        do = do_ref[pl.ds(q_start, block_q), g, :]
        lse = lse_ref[g, pl.ds(q_start, block_q)]
        delta = delta_ref[g, pl.ds(q_start, block_q)]
        slope = None if slope_ref is None else slope_ref[g]
        q_segments = None if seg_ref is None else seg_ref[pl.ds(q_start, block_q)]
        s = block_scores(q, k, scale=scale, q_start=q_start, k_start=k_start, causal=masked,
                         slope=slope, q_segments=q_segments, k_segments=k_segments)
        p = jnp.exp(s - lse[:, None])
        dv = dv + dot_tn(p.astype(do.dtype), do)
        ds = p * (dot_nt(do, v) - delta[:, None])
        dk = dk + dot_tn(ds.astype(q.dtype), q)
        return dk, dv

    num_q_blocks = seq_len // block_q
    # causal: the query blocks below the diagonal skip the mask, those on it apply it
    whole = (first_unmasked_query_block(k_start, block_q=block_q, block_k=block_k,
                                        num_q_blocks=num_q_blocks) if causal else first_q_block)

    def group(g, carry):
        carry = lax.fori_loop(first_q_block, whole, functools.partial(q_block, g, causal),
                              carry)
        return lax.fori_loop(whole, jnp.int32(num_q_blocks),
                             functools.partial(q_block, g, False), carry)

    zeros = jnp.zeros((block_k, head_dim), jnp.float32)
    dk, dv = lax.fori_loop(0, groups, group, (zeros, zeros))
    dk_ref[...] = (dk * scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def flash_dq(q, k, v, do, lse, delta, slopes, segment_ids, *, scale: float, causal: bool,
             launch: Launch, interpret: bool = False) -> jax.Array:
    """dq [b, s, h, d]; lse and delta are float32 [b, h, s]."""
    block_q, block_k = launch.block_q, launch.block_k
    q, k, v, do, lse, delta, slopes, segment_ids = match_vma(
        (q, k, v, do, lse, delta, slopes, segment_ids), q, k, v, do, lse, segment_ids)
    batch, seq_len, heads, head_dim = q.shape
    groups = heads // k.shape[2]
    q_spec = pl.BlockSpec((None, block_q, None, head_dim), lambda b, h, i: (b, i, h, 0))
    kv_spec = pl.BlockSpec((None, seq_len, None, head_dim),
                           lambda b, h, i: (b, 0, h // groups, 0))
    row_spec = pl.BlockSpec((None, None, block_q), lambda b, h, i: (b, h, i))
    slope_spec = None if slopes is None else pl.BlockSpec((None,), lambda b, h, i: (h,))
    seg_spec = None if segment_ids is None else pl.BlockSpec((None, seq_len),
                                                             lambda b, h, i: (b, 0))
    kernel = functools.partial(_dq_kernel, scale=scale, causal=causal, block_q=block_q,
                               block_k=block_k)
    return pl.pallas_call(
        kernel,
        grid=(batch, heads, seq_len // block_q),
        in_specs=[q_spec, kv_spec, kv_spec, q_spec, row_spec, row_spec, slope_spec, seg_spec],
        out_specs=q_spec,
        out_shape=out_struct(q.shape, q.dtype, q),
        compiler_params=compiler_params(launch),
        interpret=interpret,
        name="flash_attention_dq",
    )(q, k, v, do, lse, delta, slopes, segment_ids)


def flash_dkv(q, k, v, do, lse, delta, slopes, segment_ids, *, scale: float, causal: bool,
              launch: Launch, interpret: bool = False) -> tuple[jax.Array, jax.Array]:
    """(dk, dv) [b, s, kv_heads, d], summed over the query heads of each kv head."""
    block_q, block_k = launch.block_q, launch.block_k
    q, k, v, do, lse, delta, slopes, segment_ids = match_vma(
        (q, k, v, do, lse, delta, slopes, segment_ids), q, k, v, do, lse, segment_ids)
    batch, seq_len, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    groups = heads // kv_heads
    # Query head h belongs to kv head h // groups, so splitting the head axis is a free view.
    q5 = q.reshape(batch, seq_len, kv_heads, groups, head_dim)
    do5 = do.reshape(batch, seq_len, kv_heads, groups, head_dim)
    lse4 = lse.reshape(batch, kv_heads, groups, seq_len)
    delta4 = delta.reshape(batch, kv_heads, groups, seq_len)
    q_spec = pl.BlockSpec((None, seq_len, None, groups, head_dim),
                          lambda b, h, j: (b, 0, h, 0, 0))
    kv_spec = pl.BlockSpec((None, block_k, None, head_dim), lambda b, h, j: (b, j, h, 0))
    row_spec = pl.BlockSpec((None, None, groups, seq_len), lambda b, h, j: (b, h, 0, 0))
    slope_spec = None
    if slopes is not None:
        slopes = slopes.reshape(kv_heads, groups)
        slope_spec = pl.BlockSpec((None, groups), lambda b, h, j: (h, 0))
    seg_spec = None if segment_ids is None else pl.BlockSpec((None, seq_len),
                                                             lambda b, h, j: (b, 0))
    kernel = functools.partial(_dkv_kernel, scale=scale, causal=causal, block_q=block_q,
                               block_k=block_k)
    return pl.pallas_call(
        kernel,
        grid=(batch, kv_heads, seq_len // block_k),
        in_specs=[q_spec, kv_spec, kv_spec, q_spec, row_spec, row_spec, slope_spec, seg_spec],
        out_specs=[kv_spec, kv_spec],
        out_shape=[out_struct(k.shape, k.dtype, q), out_struct(v.shape, v.dtype, q)],
        compiler_params=compiler_params(launch),
        interpret=interpret,
        name="flash_attention_dkv",
    )(q5, k, v, do5, lse4, delta4, slopes, segment_ids)
