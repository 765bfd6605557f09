"""Public entry points: ``all_gather`` and ``reduce_scatter`` by algorithm name."""
from __future__ import annotations

from typing import Callable

import jax

from collectives import xla

AxisName = str | tuple[str, ...]

# name -> (all_gather(x, axis_name, axis), reduce_scatter(x, axis_name, axis))
ALGORITHMS: dict[str, tuple[Callable, Callable]] = {
    "xla": (xla.all_gather, xla.reduce_scatter),
}


def _lookup(algorithm: str) -> tuple[Callable, Callable]:
    try:
        return ALGORITHMS[algorithm]
    except KeyError:
        raise ValueError(
            f"unknown collectives algorithm {algorithm!r}; valid: {sorted(ALGORITHMS)}"
        ) from None


def all_gather(x: jax.Array, axis_name: AxisName, *, axis: int = 0,
               algorithm: str = "xla") -> jax.Array:
    """Concatenate every rank's ``x`` along ``axis`` (tiled), over mesh axis ``axis_name``.

    Differentiable: the gradient is the matching reduce-scatter.
    """
    return _lookup(algorithm)[0](x, axis_name, axis)


def reduce_scatter(x: jax.Array, axis_name: AxisName, *, axis: int = 0,
                   algorithm: str = "xla") -> jax.Array:
    """Sum ``x`` over ``axis_name`` and keep this rank's tile along ``axis``.

    Differentiable: the gradient is the matching all-gather.
    """
    return _lookup(algorithm)[1](x, axis_name, axis)
