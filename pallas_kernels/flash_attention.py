"""Differentiable Pallas FlashAttention: forward and backward kernels tied by jax.custom_vjp."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels.flash_backward import flash_dkv, flash_dq
from pallas_kernels.flash_forward import flash_forward
from pallas_kernels.flash_tuning import launch, row_bytes
from pallas_kernels.interpret import run_unvarying


def _run(interpret: bool, kernel, *args, **kwargs):
    """A kernel call; in interpret mode through :func:`run_unvarying` (shard_map)."""
    if interpret:
        return run_unvarying(lambda *a: kernel(*a, interpret=True, **kwargs), *args)
    return kernel(*args, **kwargs)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7, 8, 9))
def flash_attention(q: jax.Array, k: jax.Array, v: jax.Array, slopes: jax.Array | None,
                    segment_ids: jax.Array | None, scale: float, causal: bool,
                    block_q: int | None, block_k: int | None, interpret: bool) -> jax.Array:
    """FlashAttention on validated, padded inputs; ALiBi slopes and segment ids get no
    gradient. Tiles: ``block_q``/``block_k`` for every kernel, or (None) each kernel's
    own (``flash_tuning.launch``)."""
    return _fwd(q, k, v, slopes, segment_ids, scale, causal, block_q, block_k, interpret)[0]


def _launch(kernel: str, q: jax.Array, block_q: int | None, block_k: int | None):
    return launch(kernel, row_bytes(q.shape[3], q.dtype), q.shape[1], block_q, block_k)


def _fwd(q, k, v, slopes, segment_ids, scale, causal, block_q, block_k, interpret):
    out, lse = _run(interpret, flash_forward, q, k, v, slopes, segment_ids, scale=scale,
                    causal=causal, launch=_launch("forward", q, block_q, block_k))
    return out, (q, k, v, slopes, segment_ids, out, lse)


def _bwd(scale, causal, block_q, block_k, interpret, residuals, do):
    q, k, v, slopes, segment_ids, out, lse = residuals
    # delta_i = sum_d out_i * dout_i = sum_j p_ij * dp_ij, the softmax-backward row term.
    delta = jnp.einsum("bshd,bshd->bhs", out.astype(jnp.float32), do.astype(jnp.float32))
    args = (q, k, v, do, lse, delta, slopes, segment_ids)
    dq = _run(interpret, flash_dq, *args, scale=scale, causal=causal,
              launch=_launch("dq", q, block_q, block_k))
    dk, dv = _run(interpret, flash_dkv, *args, scale=scale, causal=causal,
                  launch=_launch("dkv", q, block_q, block_k))
    return dq, dk, dv, None, None


flash_attention.defvjp(_fwd, _bwd)
