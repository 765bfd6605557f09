"""Values one pipeline stage computed, made available on every stage."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax


def from_stage(tree: Any, stage: jax.Array, source: int, axis: str = "pp") -> Any:
    """Every leaf as stage ``source`` holds it, on all stages: a masked ``psum`` over
    ``axis``, in float32 (XLA:CPU aborts on bf16 all-reduces, jax 0.10.2)."""
    def one(x):
        masked = jnp.where(stage == source, x, jnp.zeros_like(x)).astype(jnp.float32)
        return lax.psum(masked, axis).astype(x.dtype)
    return jax.tree.map(one, tree)
