"""Attention as models call it: through the layer context.

Outside a step this is :func:`pallas_kernels.attention`. Inside one the step installs a
version that runs the kernel on each device's local batch and heads
(:mod:`jaxsmp.train.attention`), so the model never sees a mesh.
"""
from __future__ import annotations

import jax

from jaxsmp.nn.layer_context import current_layer_context


def attention(q: jax.Array, k: jax.Array, v: jax.Array, **kwargs) -> jax.Array:
    """``pallas_kernels.attention(q, k, v, **kwargs)`` as the current step runs it."""
    return current_layer_context().attention(q, k, v, **kwargs)
