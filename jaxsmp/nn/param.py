"""Parameters annotated with logical axis names (the sharding rules read them)."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

Initializer = Callable[[jax.Array, Sequence[int], jnp.dtype], jax.Array]


def is_var(x) -> bool:
    """``is_leaf`` for trees of parameters: stop at each ``nnx.Variable``."""
    return isinstance(x, nnx.Variable)


def path_names(path: Sequence[Any]) -> tuple[str, ...]:
    """A pytree path as names: attribute names, dict keys and sequence indices."""
    def name(key) -> str:
        for attr in ("name", "key", "idx"):
            if hasattr(key, attr):
                return str(getattr(key, attr))
        raise TypeError(f"unsupported pytree key {key!r}")
    return tuple(name(k) for k in path)


def variables_by_path(params: Any) -> dict[tuple[str, ...], nnx.Variable]:
    """Every parameter ``Variable`` of ``params`` keyed by :func:`path_names`."""
    flat = jax.tree_util.tree_flatten_with_path(params, is_leaf=is_var)[0]
    return {path_names(path): v for path, v in flat}


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
