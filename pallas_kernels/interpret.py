"""Running Pallas kernels in interpret mode inside ``jax.shard_map``.

JAX's Pallas interpreter (jax 0.10-0.12) evaluates a kernel in loops whose carries it
type-checks against the kernel's own types, which never vary over manual mesh axes;
inputs that do vary (every per-device shard inside ``shard_map``) fail that check
("Scan carry input and output got mismatched varying manual axes"). Interpret mode
only serves CPU testing, so :func:`run_unvarying` sidesteps it: every device gathers
all devices' inputs over those axes (a ``psum`` of one-hot slots, whose result no
longer varies), runs the kernel on each device's inputs (``vmap``) and keeps its own
result. The kernel computes exactly its local result, ``n`` times over; compiled GPU
kernels never take this path. Call it outside autodiff (in a custom VJP's rules).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels.vma import match_vma, varying


def run_unvarying(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` for arguments that may vary over manual ``shard_map`` axes."""
    leaves = jax.tree.leaves(args)
    axes = tuple(sorted(frozenset().union(*(varying(x) for x in leaves))))
    if not axes:
        return fn(*args)
    n = math.prod(lax.axis_size(a) for a in axes)
    me = lax.axis_index(axes)

    def gather(x):  # [n, *x.shape], equal on every device; float32 sums (XLA:CPU and bf16)
        wide = jnp.float32 if jnp.issubdtype(x.dtype, jnp.floating) else x.dtype
        slots = jnp.zeros((n, *x.shape), wide).at[me].set(x.astype(wide))
        return lax.psum(slots, axes).astype(x.dtype)
    outs = jax.vmap(fn)(*jax.tree.map(gather, match_vma(args, *leaves)))
    return jax.tree.map(lambda out: out[me], outs)
