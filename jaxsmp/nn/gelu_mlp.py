"""The 4h GeLU MLP of GPT-NeoX and Bloom (Hugging Face parameter names)."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxsmp.nn.linear import Linear


@jax.custom_jvp
def exact_gelu(x: jax.Array) -> jax.Array:
    """``x * Phi(x)`` (erf form), as ``jax.nn.gelu(x, approximate=False)``. Its derivative
    ``Phi(x) + x * phi(x)`` is given by hand: JAX 0.12's own erf derivative fails inside
    ``shard_map`` ("Primitive polynomial requires varying manual axes to match")."""
    return x * _normal_cdf(x)


def _normal_cdf(x: jax.Array) -> jax.Array:
    return 0.5 * (1 + jax.lax.erf(x * (2 ** -0.5)))


@exact_gelu.defjvp
def _exact_gelu_jvp(primals, tangents):
    (x,), (dx,) = primals, tangents
    cdf = _normal_cdf(x)
    pdf = jnp.exp(-0.5 * x * x) * (2 * math.pi) ** -0.5
    return x * cdf, (cdf + x * pdf) * dx


class GeluMLP(nnx.Module):
    """``dense_4h_to_h(gelu(dense_h_to_4h(x)))``: column- then row-parallel over ``mlp``."""

    def __init__(self, hidden: int, intermediate: int, *, approximate: bool, init_std: float,
                 rngs: nnx.Rngs):
        self.approximate = approximate
        self.dense_h_to_4h = Linear(hidden, intermediate, in_axis="embed", out_axis="mlp",
                                    rngs=rngs, init_std=init_std)
        self.dense_4h_to_h = Linear(intermediate, hidden, in_axis="mlp", out_axis="embed",
                                    rngs=rngs, init_std=init_std)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.dense_h_to_4h(x)
        h = jax.nn.gelu(h, approximate=True) if self.approximate else exact_gelu(h)
        return self.dense_4h_to_h(h)
