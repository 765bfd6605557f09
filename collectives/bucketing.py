"""Bucketed collectives: a whole pytree of shards in one collective.

Layout (interleaved by rank): each rank flattens its pieces of every leaf into one
buffer ``[leaf0 | leaf1 | ...]``; the tiled all-gather of that buffer is
``[rank0: leaf0 | leaf1 ... | rank1: leaf0 | leaf1 ... | ...]``, so every rank's piece
of every tensor is contiguous and one ``(p, N)`` view plus a slice per leaf recovers
each full tensor. Reduce-scatter builds the same ``(p, N)`` buffer from full-size
leaves (block ``r`` of each leaf in row ``r``) with one concatenate. The gather moves the
leaves' bytes (bitcast to uint8), so any mix of dtypes is one collective; the
reduce-scatter sums, so it uses one buffer per dtype (one collective for a layer of
one dtype).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from collectives import api
from collectives.layout import AxisName, axis_size, stack_to_tiled, tiled_to_stack
from collectives.topology import Topology

PyTree = Any


def _dtype_groups(leaves: list[jax.Array], axes: list[int | None]) -> list[list[int]]:
    groups: dict[Any, list[int]] = {}
    for i, (leaf, ax) in enumerate(zip(leaves, axes)):
        if ax is not None:
            groups.setdefault(jnp.dtype(leaf.dtype), []).append(i)
    return list(groups.values())


def _to_bytes(a: jax.Array) -> jax.Array:
    """Flat uint8 view of ``a`` (a bitcast, no arithmetic)."""
    if a.dtype == jnp.bool_:
        return a.astype(jnp.uint8).reshape(-1)
    return jax.lax.bitcast_convert_type(a, jnp.uint8).reshape(-1)


def _from_bytes(b: jax.Array, shape: tuple[int, ...], dtype) -> jax.Array:
    """Inverse of :func:`_to_bytes` for leading dims ``shape``."""
    dtype = jnp.dtype(dtype)
    if dtype == jnp.bool_:
        return b.reshape(shape).astype(jnp.bool_)
    tail = (dtype.itemsize,) if dtype.itemsize > 1 else ()
    return jax.lax.bitcast_convert_type(b.reshape(shape + tail), dtype)


def _gather(leaves, axes, axis_name, collective) -> list[jax.Array]:
    """One collective for all sharded leaves, whatever their dtypes: a gather only moves
    bytes, so the flat buffer is the leaves' bytes."""
    p = axis_size(axis_name)
    out = list(leaves)
    idx = [i for i, ax in enumerate(axes) if ax is not None]
    if not idx:
        return out
    flat = jnp.concatenate([_to_bytes(leaves[i]) for i in idx])
    rows = collective(flat).reshape(p, flat.size)
    offset = 0
    for i in idx:
        shard = leaves[i]
        nbytes = shard.size * shard.dtype.itemsize
        piece = _from_bytes(rows[:, offset:offset + nbytes], (p,) + shard.shape, shard.dtype)
        out[i] = stack_to_tiled(piece, axes[i])
        offset += nbytes
    return out


def _scatter(leaves, axes, axis_name, collective) -> list[jax.Array]:
    p = axis_size(axis_name)
    out = list(leaves)
    for idx in _dtype_groups(leaves, axes):
        blocks = [tiled_to_stack(leaves[i], p, axes[i]) for i in idx]
        rows = jnp.concatenate([b.reshape(p, -1) for b in blocks], axis=1)
        flat = collective(rows.reshape(-1))
        offset = 0
        for i, b in zip(idx, blocks):
            size = b[0].size
            out[i] = flat[offset:offset + size].reshape(b.shape[1:])
            offset += size
    return out


def _tree_pair(axis_name: AxisName, axes: list[int | None], algorithm: str,
               topology: Topology | None) -> tuple[Callable, Callable]:
    def ag(flat):
        return api.all_gather(flat, axis_name, algorithm=algorithm, topology=topology)

    def rs(flat):
        return api.reduce_scatter(flat, axis_name, algorithm=algorithm, topology=topology)

    @jax.custom_vjp
    def gather(leaves):
        return _gather(leaves, axes, axis_name, ag)

    @jax.custom_vjp
    def scatter(leaves):
        return _scatter(leaves, axes, axis_name, rs)

    gather.defvjp(lambda leaves: (gather(leaves), None), lambda _, ct: (scatter(ct),))
    scatter.defvjp(lambda leaves: (scatter(leaves), None), lambda _, ct: (gather(ct),))
    return gather, scatter


def _flat_axes(tree: PyTree, axes: PyTree) -> tuple[list, Any, list[int | None]]:
    leaves, treedef = jax.tree.flatten(tree)
    flat_axes = treedef.flatten_up_to(axes)
    return leaves, treedef, [None if a is None else a % leaves[i].ndim
                             for i, a in enumerate(flat_axes)]


def all_gather_tree(tree: PyTree, axis_name: AxisName, axes: PyTree, algorithm: str = "xla",
                    *, topology: Topology | None = None) -> PyTree:
    """All-gather every leaf of ``tree`` along its axis in ``axes`` (same structure; None =
    not sharded, passed through) with one collective. Differentiable: the
    gradient is :func:`reduce_scatter_tree`."""
    leaves, treedef, flat_axes = _flat_axes(tree, axes)
    gather, _ = _tree_pair(axis_name, flat_axes, algorithm, topology)
    return jax.tree.unflatten(treedef, gather(leaves))


def reduce_scatter_tree(tree: PyTree, axis_name: AxisName, axes: PyTree, algorithm: str = "xla",
                        *, topology: Topology | None = None) -> PyTree:
    """Reduce-scatter every leaf of ``tree`` along its axis in ``axes`` (None = passed
    through) with one collective per dtype. Differentiable: the gradient is
    :func:`all_gather_tree`."""
    leaves, treedef, flat_axes = _flat_axes(tree, axes)
    _, scatter = _tree_pair(axis_name, flat_axes, algorithm, topology)
    return jax.tree.unflatten(treedef, scatter(leaves))
