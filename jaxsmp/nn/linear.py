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
    is :func:`~jaxsmp.nn.fp8.fp8_dot`. The step's context may run it over a gathered
    batch (:class:`~jaxsmp.nn.LayerContext`'s ``linear``)."""

    def __init__(self, in_features: int, out_features: int, *, in_axis: str,
                 out_axis: str, rngs: nnx.Rngs, use_bias: bool = True,
                 init_std: float = 0.02):
        self.kernel = logical_param(rngs, nnx.initializers.normal(init_std),
                                    (in_features, out_features), (in_axis, out_axis))
        self.bias = (logical_param(rngs, nnx.initializers.zeros, (out_features,), (out_axis,))
                     if use_bias else None)
        self.fp8 = None
        self.in_axis, self.out_axis = in_axis, out_axis

    def __call__(self, x: jax.Array) -> jax.Array:
        kernel, ctx = self.kernel[...], current_layer_context()

        def matmul(x: jax.Array) -> jax.Array:
            if self.fp8 is not None and ctx.fp8:
                return fp8_dot(x.astype(kernel.dtype), kernel, self.fp8[...], kernel.dtype)
            return jnp.einsum("...i,io->...o", x.astype(kernel.dtype), kernel)
        bias = None if self.bias is None else self.bias[...]
        return ctx.linear(self.in_axis, self.out_axis, x, matmul, bias)
