"""Parameters annotated with logical axis names (the sharding rules read them)."""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx

Initializer = Callable[[jax.Array, Sequence[int], jnp.dtype], jax.Array]


def logical_param(rngs: nnx.Rngs, init: Initializer, shape: Sequence[int],
                  axes: Sequence[str | None], dtype: jnp.dtype = jnp.float32) -> nnx.Param:
    """An ``nnx.Param`` whose ``out_sharding`` metadata holds the logical axes ``axes``."""
    if len(axes) != len(shape):
        raise ValueError(f"{len(axes)} logical axes {tuple(axes)} for shape {tuple(shape)}")
    value = init(rngs.params(), tuple(shape), dtype)
    return nnx.Param(value, out_sharding=tuple(axes), eager_sharding=False)


def logical_axes(variable: nnx.Variable) -> tuple[str | None, ...]:
    """The logical axis names a parameter was created with."""
    meta = variable.get_metadata()
    axes = meta.get("out_sharding", meta.get("sharding_names"))
    if axes is None:
        raise ValueError(f"parameter of shape {variable.shape} has no logical axis names; "
                         "create it with jaxsmp.nn.logical_param or out_sharding=")
    return tuple(axes)
