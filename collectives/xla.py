"""XLA's own collectives (the baseline every other algorithm is checked against)."""
from __future__ import annotations

import jax


def all_gather(x: jax.Array, axis_name, axis: int) -> jax.Array:
    return jax.lax.all_gather(x, axis_name, axis=axis, tiled=True)


def reduce_scatter(x: jax.Array, axis_name, axis: int) -> jax.Array:
    return jax.lax.psum_scatter(x, axis_name, scatter_dimension=axis, tiled=True)
