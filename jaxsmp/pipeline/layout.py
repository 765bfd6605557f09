"""Where the stacked layers live for a pipeline schedule.

The ``layers`` axis is split contiguously over ``pp`` (rule ``layers -> pp``), which
is the ``simple`` layout. ``virtual`` wants stage ``s`` to hold chunks ``s, s+p, ...``:
the step permutes the stacked parameters into that order before its ``shard_map``
(GSPMD moves the layers between stages, once per step) and permutes the gradients
back, so the stored layout, checkpoints and optimizer state stay contiguous.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxsmp.train.param_gather import is_stacked


def _is_var(x) -> bool:
    return isinstance(x, nnx.Variable)


def permute_stacked(tree: Any, params: nnx.State, order: np.ndarray) -> Any:
    """``tree`` (parameters or gradients shaped like ``params``) with every stacked
    leaf's layer axis reordered by ``order``."""
    def permute(var: nnx.Variable, leaf: Any) -> Any:
        if not is_stacked(var):
            return leaf
        if _is_var(leaf):
            return leaf.replace(jnp.take(leaf[...], order, axis=0))
        return jnp.take(leaf, order, axis=0)
    return jax.tree.map(permute, params, tree, is_leaf=_is_var)


def inverse(order: np.ndarray) -> np.ndarray:
    inv = np.empty_like(order)
    inv[order] = np.arange(len(order))
    return inv
