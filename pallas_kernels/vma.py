"""Varying-axes types for kernels called inside ``jax.shard_map`` (``check_vma=True``).

A loop carry or a ``pallas_call`` output must state which manual mesh axes it varies
over; kernels here make all their inputs vary over the union of their axes and give
outputs that type.
"""
from __future__ import annotations

from typing import Any

import jax
from jax import lax


def varying(x) -> frozenset:
    """The manual mesh axes ``x`` varies over (empty outside ``shard_map``)."""
    return frozenset(jax.typeof(x).mat.varying)


def match_vma(tree: Any, *refs) -> Any:
    """``tree``'s arrays made varying over every axis that some of ``refs`` (or the
    array itself) varies over."""
    axes = frozenset().union(*(varying(r) for r in refs if r is not None))

    def cast(x):
        missing = tuple(sorted(axes - varying(x)))
        return lax.pcast(x, missing, to="varying") if missing else x
    return jax.tree.map(cast, tree)


def out_struct(shape: tuple[int, ...], dtype, like: jax.Array) -> jax.ShapeDtypeStruct:
    """The ``pallas_call`` output type ``shape``/``dtype`` varying as ``like`` does."""
    return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=jax.typeof(like).mat)
