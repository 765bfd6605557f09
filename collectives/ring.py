"""Ring all-gather / reduce-scatter: ``p - 1`` neighbour steps of ``jax.lax.ppermute``."""
from __future__ import annotations

import jax

from collectives.differentiable import transpose_pair
from collectives.layout import AxisName, axis_size, order_received, stack_to_tiled, tiled_to_stack


def _shift(p: int) -> list[tuple[int, int]]:
    return [(r, (r + 1) % p) for r in range(p)]


def _all_gather(x: jax.Array, axis_name: AxisName, axis: int) -> jax.Array:
    p = axis_size(axis_name)
    rank = jax.lax.axis_index(axis_name)
    chunks = [x]  # chunks[k] = shard of rank - k
    for _ in range(p - 1):
        chunks.append(jax.lax.ppermute(chunks[-1], axis_name, _shift(p)))
    return stack_to_tiled(order_received(chunks, rank), axis)


def _reduce_scatter(x: jax.Array, axis_name: AxisName, axis: int) -> jax.Array:
    p = axis_size(axis_name)
    rank = jax.lax.axis_index(axis_name)
    blocks = tiled_to_stack(x, p, axis)

    def block(offset: int) -> jax.Array:
        return jax.lax.dynamic_index_in_dim(blocks, (rank + offset) % p, 0, keepdims=False)

    acc = block(-1)  # partial sum travelling towards its owner, rank + p - 1 hops away
    for step in range(p - 1):
        acc = jax.lax.ppermute(acc, axis_name, _shift(p)) + block(-2 - step)
    return acc


all_gather, reduce_scatter = transpose_pair(_all_gather, _reduce_scatter)
