"""Conversions between a tiled array and a stack of per-rank blocks.

A *tiled* array holds ``p`` equal blocks side by side along ``axis`` (block ``r``
belongs to rank ``r``); a *stack* holds the same blocks along a new leading axis.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

AxisName = str | tuple[str, ...]


def axis_names(axis_name: AxisName | None) -> tuple[str, ...]:
    """A mesh axis, several, or None (no axis) as a tuple of axis names."""
    if axis_name is None:
        return ()
    return (axis_name,) if isinstance(axis_name, str) else tuple(axis_name)


def axis_size(axis_name: AxisName) -> int:
    """Static number of ranks along ``axis_name`` (a mesh axis or tuple of axes)."""
    return int(jax.lax.axis_size(axis_name))


def stack_to_tiled(stack: jax.Array, axis: int) -> jax.Array:
    """``(p, *s)`` -> array of shape ``s`` with ``s[axis]`` multiplied by ``p``."""
    p, shape = stack.shape[0], stack.shape[1:]
    axis = axis % len(shape)
    moved = jnp.moveaxis(stack, 0, axis)
    return moved.reshape(shape[:axis] + (p * shape[axis],) + shape[axis + 1:])


def tiled_to_stack(x: jax.Array, p: int, axis: int) -> jax.Array:
    """Inverse of :func:`stack_to_tiled`: split ``axis`` into ``p`` blocks, stack them first."""
    axis = axis % x.ndim
    n, rem = divmod(x.shape[axis], p)
    if rem:
        raise ValueError(f"axis {axis} of shape {x.shape} is not divisible by {p} ranks")
    split = x.reshape(x.shape[:axis] + (p, n) + x.shape[axis + 1:])
    return jnp.moveaxis(split, axis, 0)


def order_received(chunks: list[jax.Array], position: jax.Array) -> jax.Array:
    """Stack chunks received as ``chunks[k]`` = block of group position ``position - k``
    into group order (row ``j`` = block of position ``j``)."""
    size = len(chunks)
    stacked = jnp.stack(chunks)
    src = (position - jnp.arange(size)) % size
    return jnp.take(stacked, src, axis=0)
