"""Pair an all-gather with its reduce-scatter so each is the other's gradient."""
from __future__ import annotations

from collections.abc import Callable
from functools import partial

import jax

Raw = Callable[..., jax.Array]  # (x, axis_name, axis, *static) -> array


def transpose_pair(gather: Raw, scatter: Raw) -> tuple[Raw, Raw]:
    """Wrap raw ``gather``/``scatter`` in custom VJPs: d(gather) = scatter and vice versa.

    Both take ``(x, axis_name, axis, *static)``; everything after ``x`` must be hashable.
    """

    @partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
    def all_gather(x, axis_name, axis, static=()):
        return gather(x, axis_name, axis, *static)

    @partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
    def reduce_scatter(x, axis_name, axis, static=()):
        return scatter(x, axis_name, axis, *static)

    def gather_fwd(x, axis_name, axis, static):
        return gather(x, axis_name, axis, *static), None

    def gather_bwd(axis_name, axis, static, _, ct):
        return (reduce_scatter(ct, axis_name, axis, static),)

    def scatter_fwd(x, axis_name, axis, static):
        return scatter(x, axis_name, axis, *static), None

    def scatter_bwd(axis_name, axis, static, _, ct):
        return (all_gather(ct, axis_name, axis, static),)

    all_gather.defvjp(gather_fwd, gather_bwd)
    reduce_scatter.defvjp(scatter_fwd, scatter_bwd)
    return all_gather, reduce_scatter
