"""Differentiable Pallas FlashAttention: forward and backward kernels tied by jax.custom_vjp."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels.flash_backward import flash_dkv, flash_dq
from pallas_kernels.flash_forward import flash_forward
from pallas_kernels.interpret import run_unvarying


def _run(interpret: bool, kernel, *args, **kwargs):
    """A kernel call; in interpret mode through :func:`run_unvarying` (shard_map)."""
    if interpret:
        return run_unvarying(lambda *a: kernel(*a, interpret=True, **kwargs), *args)
    return kernel(*args, **kwargs)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8, 9))
def flash_attention(q: jax.Array, k: jax.Array, v: jax.Array, slopes: jax.Array | None,
                    segment_ids: jax.Array | None, scale: float, causal: bool, block_q: int,
                    block_k: int, interpret: bool) -> jax.Array:
    """FlashAttention on validated inputs; ALiBi slopes and segment ids get no gradient."""
    return _fwd(q, k, v, slopes, segment_ids, scale, causal, block_q, block_k, interpret)[0]


def _fwd(q, k, v, slopes, segment_ids, scale, causal, block_q, block_k, interpret):
    out, lse = _run(interpret, flash_forward, q, k, v, slopes, segment_ids, scale=scale,
                    causal=causal, block_q=block_q, block_k=block_k)
    return out, (q, k, v, slopes, segment_ids, out, lse)


def _bwd(scale, causal, block_q, block_k, interpret, residuals, do):
    q, k, v, slopes, segment_ids, out, lse = residuals
    # delta_i = sum_d out_i * dout_i = sum_j p_ij * dp_ij, the softmax-backward row term.
    delta = jnp.einsum("bshd,bshd->bhs", out.astype(jnp.float32), do.astype(jnp.float32))
    kwargs = dict(scale=scale, causal=causal, block_q=block_q, block_k=block_k)
    args = (q, k, v, do, lse, delta, slopes, segment_ids)
    dq = _run(interpret, flash_dq, *args, **kwargs)
    dk, dv = _run(interpret, flash_dkv, *args, **kwargs)
    return dq, dk, dv, None, None


flash_attention.defvjp(_fwd, _bwd)
