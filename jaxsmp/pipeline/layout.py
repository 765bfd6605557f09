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

from jaxsmp.nn.param import is_var
from jaxsmp.nn.stack import is_stacked


def virtual_layer_order(num_layers: int, stages: int, chunks: int) -> np.ndarray:
    """Stored-layer permutation giving stage ``s`` the chunks ``s, s+p, s+2p, ...``
    (contiguous over ``pp`` after permuting)."""
    if num_layers % (stages * chunks):
        raise ValueError(
            f"the virtual pipeline needs the {num_layers} stacked layers divisible into "
            f"pp x chunks = {stages} x {chunks} = {stages * chunks} equal chunks")
    n = num_layers // (stages * chunks)
    chunk_ids = [c * stages + s for s in range(stages) for c in range(chunks)]
    return np.concatenate([np.arange(i * n, (i + 1) * n) for i in chunk_ids])


def permute_stacked(tree: Any, params: Any, order: np.ndarray) -> Any:
    """``tree`` (parameters or gradients shaped like ``params``) with every stacked
    leaf's layer axis reordered by ``order``."""
    def permute(var, leaf: Any) -> Any:
        if not is_stacked(var):
            return leaf
        if is_var(leaf):
            return leaf.replace(jnp.take(leaf[...], order, axis=0))
        return jnp.take(leaf, order, axis=0)
    return jax.tree.map(permute, params, tree, is_leaf=is_var)


def inverse(order: np.ndarray) -> np.ndarray:
    inv = np.empty_like(order)
    inv[order] = np.arange(len(order))
    return inv
