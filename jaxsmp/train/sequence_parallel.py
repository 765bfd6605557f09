"""Megatron sequence parallelism: between the tensor-parallel matmuls, activations are
split over ``tp`` on the sequence.

Each layer's input and output, ``[batch, seq, hidden]``, is constrained to
``seq`` split over ``tp``; GSPMD then runs LayerNorm, the residual adds and dropout on
``1/tp`` of the sequence, all-gathers the sequence before the column-parallel matmuls
and turns the all-reduce after the row-parallel ones into a reduce-scatter (Korthikanti
et al. 2022). The same bytes cross the ``tp`` group, but what the layers keep for the
backward pass outside the matmuls shrinks by ``tp``. The model never sees it: the step
wraps the layer scan (:func:`over_sequence`).
"""
from __future__ import annotations

from collections.abc import Callable

import jax

from jaxsmp.context.sequence import split_sequence
from jaxsmp.nn.stack import require_one_array


def shard_sequence(h: jax.Array, mesh: jax.sharding.Mesh) -> jax.Array:
    """``h`` ([batch, seq, ...]) constrained to its sequence split over ``tp``."""
    return split_sequence(h, mesh, ("tp",))


def over_sequence(scan: Callable, mesh: jax.sharding.Mesh) -> Callable:
    """``scan`` (a layer scan, ``scan(apply, h, params, args)``) with every layer's input
    and output split over ``tp`` on the sequence."""
    def run(apply, h, params, args, **kw):
        require_one_array(h, "sequence_parallel")

        def layer(w, x, layer_args):
            return shard_sequence(apply(w, shard_sequence(x, mesh), layer_args), mesh)
        return scan(layer, shard_sequence(h, mesh), params, args, **kw)
    return run
