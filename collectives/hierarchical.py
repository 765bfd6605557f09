"""Two-level collectives: one step among the ranks of a host, one step across hosts.

Ranks ``h*g .. h*g+g-1`` of the axis form host ``h`` (``g`` from a :class:`Topology`).
The order minimises bytes across hosts: all-gather first exchanges the small shards
across hosts (each host receives every remote shard exactly once), then gathers
within the host; reduce-scatter first reduces within the host, then across hosts
(its transpose). Each step is a direct exchange of ``ppermute``s inside the group.
"""
from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from collectives.differentiable import transpose_pair
from collectives.layout import AxisName, axis_size, order_received, stack_to_tiled, tiled_to_stack


def _group_perm(p: int, stride: int, size: int, k: int) -> list[tuple[int, int]]:
    """Send to the group member ``k`` positions ahead; groups are ``{b + j*stride}``."""
    perm = []
    for r in range(p):
        q = (r // stride) % size
        perm.append((r, r + ((q + k) % size - q) * stride))
    return perm


def _group_gather(x: jax.Array, axis_name: AxisName, p: int, stride: int, size: int) -> jax.Array:
    """Stack ``x`` of every member of this rank's group, in group order: ``(size, *x.shape)``."""
    position = (jax.lax.axis_index(axis_name) // stride) % size
    chunks = [x] + [jax.lax.ppermute(x, axis_name, _group_perm(p, stride, size, k))
                    for k in range(1, size)]
    return order_received(chunks, position)


def _group_scatter(blocks: jax.Array, axis_name: AxisName, p: int, stride: int, size: int) -> jax.Array:
    """``blocks[j]`` is for group member ``j``; return the sum of the blocks sent to this rank."""
    position = (jax.lax.axis_index(axis_name) // stride) % size
    acc = jax.lax.dynamic_index_in_dim(blocks, position, 0, keepdims=False)
    for k in range(1, size):
        out = jax.lax.dynamic_index_in_dim(blocks, (position + k) % size, 0, keepdims=False)
        acc = acc + jax.lax.ppermute(out, axis_name, _group_perm(p, stride, size, k))
    return acc


def gather_two_level(x: jax.Array, axis_name: AxisName, axis: int, group: int,
                     across: Callable[[jax.Array], jax.Array]) -> jax.Array:
    """Tiled all-gather: ``across(x)`` stacks the shards of this rank's host position from
    every host, ``(hosts, *x)`` in host order; then a gather within the host."""
    p = axis_size(axis_name)
    stacked = across(x)                                            # (hosts, *x): same local index
    within = _group_gather(stacked, axis_name, p, 1, group)        # (group, hosts, *x)
    ranks = jnp.swapaxes(within, 0, 1).reshape((p,) + x.shape)     # rank = host*group + local
    return stack_to_tiled(ranks, axis)


def scatter_two_level(x: jax.Array, axis_name: AxisName, axis: int, group: int,
                      across: Callable[[jax.Array], jax.Array]) -> jax.Array:
    """Tiled reduce-scatter: a reduction within the host, then ``across(blocks)`` sums
    ``(hosts, *blk)`` over the hosts, keeping the block of this rank's host."""
    p = axis_size(axis_name)
    hosts = p // group
    blocks = tiled_to_stack(x, p, axis)
    by_local = jnp.swapaxes(blocks.reshape((hosts, group) + blocks.shape[1:]), 0, 1)
    host_sums = _group_scatter(by_local, axis_name, p, 1, group)   # (hosts, *blk), summed in host
    return across(host_sums)


def _all_gather(x: jax.Array, axis_name: AxisName, axis: int, group: int) -> jax.Array:
    p = axis_size(axis_name)
    return gather_two_level(x, axis_name, axis, group,
                            lambda v: _group_gather(v, axis_name, p, group, p // group))


def _reduce_scatter(x: jax.Array, axis_name: AxisName, axis: int, group: int) -> jax.Array:
    p = axis_size(axis_name)
    return scatter_two_level(x, axis_name, axis, group,
                             lambda v: _group_scatter(v, axis_name, p, group, p // group))


_gather, _scatter = transpose_pair(_all_gather, _reduce_scatter)


def all_gather(x: jax.Array, axis_name: AxisName, axis: int, group: int) -> jax.Array:
    """Tiled all-gather over ``axis_name`` with ``group`` consecutive ranks per host."""
    _check_group(axis_name, group)
    return _gather(x, axis_name, axis, (group,))


def reduce_scatter(x: jax.Array, axis_name: AxisName, axis: int, group: int) -> jax.Array:
    """Tiled reduce-scatter over ``axis_name`` with ``group`` consecutive ranks per host."""
    _check_group(axis_name, group)
    return _scatter(x, axis_name, axis, (group,))


def _check_group(axis_name: AxisName, group: int) -> None:
    p = axis_size(axis_name)
    if group < 1 or p % group:
        raise ValueError(f"group size {group} does not divide axis size {p}")
