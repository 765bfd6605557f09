"""Varying-axes types inside ``jax.shard_map``: loop carries and branch outputs must
keep one type, so pipeline buffers are made varying over a fixed set of axes."""
from __future__ import annotations

import jax
from jax import lax


def varying(x) -> frozenset:
    """The manual mesh axes ``x`` (a value or its abstract value) varies over."""
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
