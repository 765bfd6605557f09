"""The training state as a nested dict of arrays (what is written) and back.

Every array leaf of a :class:`~jaxsmp.train.state.TrainState` (step, parameters,
optimizer state, loss scale) is keyed by its pytree path, e.g.
``params/layers/layers/mlp/dense_h_to_4h/kernel/value``. Static parts (graph
definition, optimizer, mesh, ``mesh_axes`` metadata) come from a template state
built for the mesh being restored onto, so a checkpoint is independent of the
mesh it was saved from.
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxsmp.nn.param import path_names
from jaxsmp.train.state import TrainState, state_shardings


def leaf_paths(state: TrainState) -> list[tuple[str, ...]]:
    """The path of every array leaf, in flattening order."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(state)
    return [path_names(path) for path, _ in leaves]


def _nest(paths: list[tuple[str, ...]], leaves: list[Any]) -> dict:
    nested: dict = {}
    for path, leaf in zip(paths, leaves):
        node = nested
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = leaf
    return nested


def _lookup(nested: dict, path: tuple[str, ...]) -> Any:
    for part in path:
        nested = nested[part]
    return nested


def to_nested(state: TrainState) -> dict:
    """The state's arrays as a nested dict keyed by pytree path."""
    return _nest(leaf_paths(state), jax.tree.leaves(state))


def target_leaves(template: TrainState) -> list[jax.ShapeDtypeStruct]:
    """Shape, dtype and sharding on the template's mesh of every array leaf."""
    shardings = jax.tree.leaves(state_shardings(template, template.mesh))
    leaves = jax.tree.leaves(template)
    return [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
            for x, s in zip(leaves, shardings)]


def restore_target(template: TrainState) -> dict:
    """Abstract nested dict for restoring into ``template``'s layout."""
    return _nest(leaf_paths(template), target_leaves(template))


def from_nested(template: TrainState, nested: dict) -> TrainState:
    """``template`` with its array leaves replaced by those in ``nested``."""
    treedef = jax.tree.structure(template)
    return jax.tree.unflatten(treedef, [_lookup(nested, p) for p in leaf_paths(template)])


def manifest(state: TrainState) -> dict[str, dict]:
    """``{path: {"shape", "dtype"}}`` for every array leaf (stored in the metadata)."""
    return {"/".join(p): {"shape": list(x.shape), "dtype": np.dtype(x.dtype).name}
            for p, x in zip(leaf_paths(state), jax.tree.leaves(state))}
