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
    """The manual mesh axes ``x`` (a value or its abstract value) varies over (empty
    outside ``shard_map``)."""
    try:  # JAX 0.10 keeps the set in aval.mat.varying, later in aval.vma
        aval = jax.typeof(x)
    except TypeError:  # already an abstract value (e.g. a jaxpr's output)
        aval = x
    vma = getattr(aval, "vma", None)
    return frozenset(vma if vma is not None else getattr(aval.mat, "varying", ()))


def vary(x, axes: frozenset):
    """``x`` made varying over ``axes`` (those it does not vary over already)."""
    missing = tuple(sorted(axes - varying(x)))
    return lax.pcast(x, missing, to="varying") if missing else x


def match_vma(tree: Any, *refs) -> Any:
    """``tree``'s arrays made varying over every axis that some of ``refs`` (or the
    array itself) varies over."""
    axes = frozenset().union(*(varying(r) for r in refs if r is not None))

    return jax.tree.map(lambda x: vary(x, axes), tree)


def out_struct(shape: tuple[int, ...], dtype, like: jax.Array) -> jax.ShapeDtypeStruct:
    """The ``pallas_call`` output type ``shape``/``dtype`` varying as ``like`` does."""
    return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=jax.typeof(like).mat)
