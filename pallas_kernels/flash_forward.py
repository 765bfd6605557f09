"""Pallas FlashAttention forward kernel: online softmax over key blocks, saves log-sum-exp."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.block_scores import (
    dot_nn,
    key_block_scores,
    num_key_blocks,
    unmasked_key_blocks,
)
from pallas_kernels.flash_tuning import Launch, compiler_params
from pallas_kernels.vma import match_vma, out_struct


def _forward_kernel(q_ref, k_ref, v_ref, slope_ref, seg_ref, o_ref, lse_ref, *,
                    scale: float, causal: bool, block_q: int, block_k: int) -> None:
    seq_len, head_dim = k_ref.shape
    q_start = pl.program_id(2) * block_q
    q = q_ref[...]
    slope = None if slope_ref is None else slope_ref[...]
    q_segments = None if seg_ref is None else seg_ref[pl.ds(q_start, block_q)]

    def body(masked: bool, kb, carry):
        acc, m, l = carry
        _, v, s = key_block_scores(q, k_ref, v_ref, seg_ref, kb, block_k=block_k, scale=scale,
                                   q_start=q_start, causal=masked, slope=slope,
                                   q_segments=q_segments)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        correction = jnp.exp(m - m_new)
        p = jnp.exp(s - m_new[:, None])
        l = correction * l + jnp.sum(p, axis=1)
        acc = correction[:, None] * acc + dot_nn(p.astype(v.dtype), v)
        return acc, m_new, l

    num_k_blocks = num_key_blocks(q_start, block_q=block_q, block_k=block_k,
                                  seq_len=seq_len, causal=causal)
    init = (jnp.zeros((block_q, head_dim), jnp.float32),
            jnp.full((block_q,), -jnp.inf, jnp.float32),
            jnp.zeros((block_q,), jnp.float32))
    # causal: the blocks left of the diagonal skip the mask, the rest apply it
    whole = unmasked_key_blocks(q_start, block_k=block_k) if causal else num_k_blocks
    carry = lax.fori_loop(0, whole, functools.partial(body, False), init)
    acc, m, l = lax.fori_loop(whole, num_k_blocks, functools.partial(body, causal), carry)
    o_ref[...] = (acc / l[:, None]).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log(l)


def flash_forward(q: jax.Array, k: jax.Array, v: jax.Array, slopes: jax.Array | None,
                  segment_ids: jax.Array | None, *, scale: float, causal: bool, launch: Launch,
                  interpret: bool = False) -> tuple[jax.Array, jax.Array]:
    """Returns (out [b, s, h, d], lse float32 [b, h, s]). Shapes are validated by the caller."""
    batch, seq_len, heads, head_dim = q.shape
    block_q, block_k = launch.block_q, launch.block_k
    groups = heads // k.shape[2]
    q, k, v, slopes, segment_ids = match_vma((q, k, v, slopes, segment_ids), q, k, v,
                                             segment_ids)
    kernel = functools.partial(_forward_kernel, scale=scale, causal=causal, block_q=block_q,
                               block_k=block_k)
    q_spec = pl.BlockSpec((None, block_q, None, head_dim), lambda b, h, i: (b, i, h, 0))
    kv_spec = pl.BlockSpec((None, seq_len, None, head_dim),
                           lambda b, h, i: (b, 0, h // groups, 0))
    slope_spec = None if slopes is None else pl.BlockSpec((None,), lambda b, h, i: (h,))
    seg_spec = None if segment_ids is None else pl.BlockSpec((None, seq_len),
                                                             lambda b, h, i: (b, 0))
    return pl.pallas_call(
        kernel,
        grid=(batch, heads, seq_len // block_q),
        in_specs=[q_spec, kv_spec, kv_spec, slope_spec, seg_spec],
        out_specs=[q_spec, pl.BlockSpec((None, None, block_q), lambda b, h, i: (b, h, i))],
        out_shape=[out_struct(q.shape, q.dtype, q),
                   out_struct((batch, heads, seq_len), jnp.float32, q)],
        compiler_params=compiler_params(launch),
        interpret=interpret,
        name="flash_attention_forward",
    )(q, k, v, slopes, segment_ids)
