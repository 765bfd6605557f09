"""Parameters annotated with logical axis names (the sharding rules read them)."""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

Initializer = Callable[[jax.Array, Sequence[int], jnp.dtype], jax.Array]


def logical_param(rngs: nnx.Rngs, init: Initializer, shape: Sequence[int],
                  axes: Sequence[str | None], dtype: jnp.dtype = jnp.float32) -> nnx.Param:
    """An ``nnx.Param`` whose ``sharding_names`` are the logical axes ``axes``."""
    if len(axes) != len(shape):
        raise ValueError(f"{len(axes)} logical axes {tuple(axes)} for shape {tuple(shape)}")
    value = init(rngs.params(), tuple(shape), dtype)
    return nnx.Param(value, sharding_names=tuple(axes), eager_sharding=False)


def logical_axes(variable: nnx.Variable) -> tuple[str | None, ...]:
    """The logical axis names a parameter was created with."""
    meta = variable.get_metadata()
    axes = meta.get("sharding_names", meta.get("out_sharding"))
    if axes is None:
        raise ValueError(f"parameter of shape {variable.shape} has no logical axis names; "
                         "create it with jaxsmp.nn.logical_param or sharding_names=")
    return tuple(axes)
