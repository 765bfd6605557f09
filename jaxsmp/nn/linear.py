"""A dense layer whose kernel and bias carry logical axis names."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxsmp.nn.param import logical_param


class Linear(nnx.Module):
    """``y = x @ kernel + bias`` with kernel axes ``(in_axis, out_axis)``."""

    def __init__(self, in_features: int, out_features: int, *, in_axis: str,
                 out_axis: str, rngs: nnx.Rngs, use_bias: bool = True,
                 init_std: float = 0.02):
        self.kernel = logical_param(rngs, nnx.initializers.normal(init_std),
                                    (in_features, out_features), (in_axis, out_axis))
        self.bias = (logical_param(rngs, nnx.initializers.zeros, (out_features,), (out_axis,))
                     if use_bias else None)

    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.kernel[...]
        y = jnp.einsum("...i,io->...o", x.astype(kernel.dtype), kernel)
        if self.bias is not None:
            y = y + self.bias[...]
        return y
