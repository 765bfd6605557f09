"""Direct all-to-all exchange: every shard goes straight to every peer in one round."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from collectives.differentiable import transpose_pair
from collectives.layout import AxisName, axis_size, stack_to_tiled, tiled_to_stack


def _all_gather(x: jax.Array, axis_name: AxisName, axis: int) -> jax.Array:
    p = axis_size(axis_name)
    copies = jnp.broadcast_to(x[None], (p,) + x.shape)
    received = jax.lax.all_to_all(copies, axis_name, 0, 0, tiled=True)
    return stack_to_tiled(received, axis)


def _reduce_scatter(x: jax.Array, axis_name: AxisName, axis: int) -> jax.Array:
    p = axis_size(axis_name)
    received = jax.lax.all_to_all(tiled_to_stack(x, p, axis), axis_name, 0, 0, tiled=True)
    return received.sum(axis=0, dtype=x.dtype)


all_gather, reduce_scatter = transpose_pair(_all_gather, _reduce_scatter)
