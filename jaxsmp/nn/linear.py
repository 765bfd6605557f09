"""A dense layer whose kernel and bias carry logical axis names; FP8 when the step asks."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxsmp.nn.fp8 import fp8_dot
from jaxsmp.nn.layer_context import current_layer_context
from jaxsmp.nn.param import logical_param


class Linear(nnx.Module):
    """``y = x @ kernel + bias`` with kernel axes ``(in_axis, out_axis)``. ``fp8``: the
    amax histories (:class:`~jaxsmp.nn.fp8.Fp8Meta`) that ``precision="fp8"`` adds
    (:func:`jaxsmp.train.fp8_state.with_fp8`); with them, inside an fp8 step the matmul
    is :func:`~jaxsmp.nn.fp8.fp8_dot`."""

    def __init__(self, in_features: int, out_features: int, *, in_axis: str,
                 out_axis: str, rngs: nnx.Rngs, use_bias: bool = True,
                 init_std: float = 0.02):
        self.kernel = logical_param(rngs, nnx.initializers.normal(init_std),
                                    (in_features, out_features), (in_axis, out_axis))
        self.bias = (logical_param(rngs, nnx.initializers.zeros, (out_features,), (out_axis,))
                     if use_bias else None)
        self.fp8 = None

    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.kernel[...]
        if self.fp8 is not None and current_layer_context().fp8:
            y = fp8_dot(x.astype(kernel.dtype), kernel, self.fp8[...], kernel.dtype)
        else:
            y = jnp.einsum("...i,io->...o", x.astype(kernel.dtype), kernel)
        if self.bias is not None:
            y = y + self.bias[...]
        return y
