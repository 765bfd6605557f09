"""LayerNorm and RMSNorm, computed in float32 whatever the compute dtype."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxsmp.nn.param import logical_param


class LayerNorm(nnx.Module):
    """LayerNorm over the last axis with scale and bias on the ``embed`` axis."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs, eps: float = 1e-5):
        self.eps = eps
        self.scale = logical_param(rngs, nnx.initializers.ones, (dim,), ("embed",))
        self.bias = logical_param(rngs, nnx.initializers.zeros, (dim,), ("embed",))

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        mean = x32.mean(-1, keepdims=True)
        var = jnp.square(x32 - mean).mean(-1, keepdims=True)
        y = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
        y = y * self.scale[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)
        return y.astype(x.dtype)


class RMSNorm(nnx.Module):
    """Root-mean-square norm (Llama) with a scale on the ``embed`` axis."""

    def __init__(self, dim: int, *, rngs: nnx.Rngs, eps: float = 1e-5):
        self.eps = eps
        self.scale = logical_param(rngs, nnx.initializers.ones, (dim,), ("embed",))

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.square(x32).mean(-1, keepdims=True) + self.eps)
        return (y * self.scale[...].astype(jnp.float32)).astype(x.dtype)
