"""LayerNorm and RMSNorm, computed in float32 whatever the compute dtype.

The backward pass computes each norm again from its input and its per-token statistics
(``jax.checkpoint`` keeping only those, named :data:`STATS_NAME`), as PyTorch's fused
LayerNorm saves its input, mean and inverse deviation: the hidden-sized float32
intermediates that autodiff of the float32 computation keeps are never held for the
backward pass, which in a layer without remat is a third of what it saves (six per
Llama layer). A hand-written VJP saving the same was tried and not kept: the same memory
without remat, more under ``remat="save_qkv"`` (docs/planner.md). ``*_reference``: the
plain computations, autodiffed whole."""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from jaxsmp.nn.param import logical_param

STATS_NAME = "norm_stats"   # a norm's mean and inverse deviation per token, kept
F32 = jnp.float32


def _inverse_deviation(square_mean: jax.Array, eps: float) -> jax.Array:
    return checkpoint_name(jax.lax.rsqrt(square_mean + eps), STATS_NAME)


def layer_norm_reference(x, scale, bias, eps: float) -> jax.Array:
    x32 = x.astype(F32)
    mean = checkpoint_name(x32.mean(-1, keepdims=True), STATS_NAME)
    centred = x32 - mean
    y = centred * _inverse_deviation(jnp.square(centred).mean(-1, keepdims=True), eps)
    return (y * scale.astype(F32) + bias.astype(F32)).astype(x.dtype)


def rms_norm_reference(x, scale, eps: float) -> jax.Array:
    x32 = x.astype(F32)
    y = x32 * _inverse_deviation(jnp.square(x32).mean(-1, keepdims=True), eps)
    return (y * scale.astype(F32)).astype(x.dtype)


def _recomputed(f, eps: float):
    # prevent_cse=False: the layers run in scans, whose backward loop never sees the
    # forward's values to merge with (JAX's advice for checkpoint inside scan)
    return jax.checkpoint(partial(f, eps=eps), prevent_cse=False,
                          policy=jax.checkpoint_policies.save_only_these_names(STATS_NAME))


def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, eps: float) -> jax.Array:
    return _recomputed(layer_norm_reference, eps)(x, scale, bias)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    return _recomputed(rms_norm_reference, eps)(x, scale)


class LayerNorm(nnx.Module):
    """LayerNorm over the last axis with scale and bias on the ``embed`` axis."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs, eps: float = 1e-5):
        self.eps = eps
        self.scale = logical_param(rngs, nnx.initializers.ones, (dim,), ("embed",))
        self.bias = logical_param(rngs, nnx.initializers.zeros, (dim,), ("embed",))

    def __call__(self, x: jax.Array) -> jax.Array:
        return layer_norm(x, self.scale[...], self.bias[...], self.eps)


class RMSNorm(nnx.Module):
    """Root-mean-square norm (Llama) with a scale on the ``embed`` axis."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs, eps: float = 1e-5):
        self.eps = eps
        self.scale = logical_param(rngs, nnx.initializers.ones, (dim,), ("embed",))

    def __call__(self, x: jax.Array) -> jax.Array:
        return rms_norm(x, self.scale[...], self.eps)
