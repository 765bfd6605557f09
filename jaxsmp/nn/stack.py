"""A stack of identical layers, stored stacked and run with one ``lax.scan``.

Compile time does not grow with depth. The layers run through the layer context's
``scan_layers``: a plain scan outside a step, ZeRO-3 inside one (each layer's
parameters gathered over ``sdp`` just before use, the next one prefetched, the gathered
weights freed after use; :mod:`jaxsmp.train.layer_scan`). With pipeline parallelism
the step's ``run_stages`` runs the stage's local layers inside a schedule over ``pp``
(:mod:`jaxsmp.pipeline.runner`).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

from jaxsmp.nn.fp8 import max_accumulating, plain_float
from jaxsmp.nn.layer_context import current_layer_context, layer_context


def is_stacked(variable: nnx.Variable) -> bool:
    """Whether a parameter belongs to a :class:`Stack` (leading ``layers`` axis)."""
    return variable.get_metadata().get("out_sharding", (None,))[:1] == ("layers",)


def require_one_array(h: Any, feature: str, instead: str = "") -> None:
    """A ValueError naming ``feature`` unless a Stack's carry ``h`` is one array (the
    hidden state): a mixture of experts also carries its router statistics, which
    ``feature`` cannot move yet. ``instead``: what to use instead, added to the message."""
    if not isinstance(h, jax.Array):
        raise ValueError(
            f"{feature} runs stacked layers whose carry is one hidden-state array; this "
            f"model's layers carry more (a mixture of experts' router statistics), which "
            f"{feature} does not support yet{'; ' + instead if instead else ''}")


class Stack(nnx.Module):
    """``num_layers`` copies of ``make_layer(rngs)``; parameters gain a leading
    ``layers`` axis. ``layer(x, *args) -> x`` is applied in order."""

    def __init__(self, make_layer: Callable[[nnx.Rngs], nnx.Module], num_layers: int,
                 *, rngs: nnx.Rngs):
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")

        @nnx.split_rngs(splits=num_layers)
        @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
        def create(rngs: nnx.Rngs) -> nnx.Module:
            return make_layer(rngs)

        self.num_layers = num_layers
        self.layers = create(rngs)

    def __call__(self, x: jax.Array, *args: Any) -> jax.Array:
        graphdef, params = nnx.split(self.layers)
        ctx = current_layer_context()

        def apply(one: nnx.State, h: jax.Array, layer_args) -> jax.Array:
            # a pipeline schedule may trace the layer after this call returns: the layer
            # (its attention) sees the context it was called in
            with layer_context(ctx):
                return nnx.merge(graphdef, one)(h, *layer_args)

        def run(h: jax.Array, layer_params: nnx.State, layer_args, active=None) -> jax.Array:
            # active: how many leading layers run (a pipeline stage's padding slots skip)
            if active is None:
                return ctx.scan_layers(apply, h, layer_params, layer_args)
            return ctx.scan_layers(apply, h, layer_params, layer_args, active=active)

        if ctx.run_stages is None:
            return run(x, params, args)
        # the schedule's ticks reuse the stage's layers: fp8 amax observations (the
        # histories' cotangents) combine by maximum over them, not by sum
        return ctx.run_stages(lambda h, p, a, *active: run(h, plain_float(p), a, *active), x,
                              max_accumulating(params), args)
