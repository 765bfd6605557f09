"""ZeRO-3 gathering of parameter shards over ``sdp`` through the collectives seam.

Every parameter carries its resolved mesh axes in its ``mesh_axes`` metadata
(set by :func:`jaxsmp.init`). Inside the step's ``shard_map`` a parameter is a
local ``sdp`` shard; gathering concatenates the shards along the dimension that
names ``sdp``. The gradient of the gather is the matching reduce-scatter.
"""
from __future__ import annotations

from typing import Callable

import jax
from flax import nnx
from jax.sharding import PartitionSpec as P

import collectives

MANUAL_AXES = ("dp", "sdp")


def _is_var(x) -> bool:
    return isinstance(x, nnx.Variable)


def mesh_axes(variable: nnx.Variable) -> tuple:
    return variable.get_metadata()["mesh_axes"]


def is_stacked(variable: nnx.Variable) -> bool:
    return variable.get_metadata().get("out_sharding", (None,))[:1] == ("layers",)


def _sdp_dim(axes: tuple, ndim: int) -> int | None:
    offset = len(axes) - ndim  # 1 for a layer sliced out of a stack
    for i, dim in enumerate(axes[offset:]):
        if dim == "sdp" or (isinstance(dim, tuple) and "sdp" in dim):
            return i
    return None


def manual_spec(axes: tuple) -> P:
    """The ``shard_map`` spec of a parameter: only its manual (data) axes."""
    def keep(dim):
        names = (dim,) if isinstance(dim, str) else (dim or ())
        kept = tuple(a for a in names if a in MANUAL_AXES)
        return kept[0] if len(kept) == 1 else (kept or None)
    return P(*[keep(d) for d in axes])


def gather_variable(var: nnx.Variable, algorithm: str) -> nnx.Variable:
    value = var[...]
    dim = _sdp_dim(mesh_axes(var), value.ndim)
    if dim is None:
        return var
    full = collectives.all_gather(value, "sdp", axis=dim, algorithm=algorithm)
    return var.replace(full)


def gather_tree(state: nnx.State, algorithm: str,
                select: Callable[[nnx.Variable], bool] = lambda v: True) -> nnx.State:
    """Gathers the selected parameters of ``state`` over ``sdp``."""
    return jax.tree.map(lambda v: gather_variable(v, algorithm) if select(v) else v,
                        state, is_leaf=_is_var)
