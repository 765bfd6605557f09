"""One chunk of a stage's layers (``virtual``) without a copy of its weights per tick.

Autodiff of the tick scan keeps, for every tick, whatever the chunk's backward reads.
The chunk's weights are a slice of the stage's that depends on the tick, so a plain
slice is kept once per tick: ``m * v`` slices, i.e. ``m`` copies of the stage's weights
(ZeRO-3 shards included), where ``simple`` keeps none (its weights are the same at
every tick, which the scan hoists). Here the backward takes the slice again from the
stage's weights, which are the same at every tick; the residuals of the layers' VJP
that *are* the slice (recognised by identity, as the ZeRO-3 layer scan recognises its
gathered weights) are dropped and put back.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax


def take(params: Any, chunk, size: int) -> Any:
    """Layers ``[chunk * size, (chunk + 1) * size)`` of every stacked leaf."""
    return jax.tree.map(lambda a: lax.dynamic_slice_in_dim(a, chunk * size, size, 0), params)


def run_chunk(run: Callable[..., jax.Array], params: Any, chunk: jax.Array, size: int,
              h: jax.Array, args: Sequence[Any], active: tuple = ()) -> jax.Array:
    """``run(h, take(params, chunk, size), args, *active)``, differentiable in ``params``,
    ``h`` and ``args``; its VJP keeps ``params`` (not the slice) and ``chunk``."""
    layout: dict = {}

    @jax.custom_vjp  # chunk and active are arguments: a custom VJP must not close over tracers
    def chunked(params, h, args, chunk, active):
        return run(h, take(params, chunk, size), args, *active)

    def forward(params, h, args, chunk, active):
        w = take(params, chunk, size)
        out, pullback = jax.vjp(lambda w, h, args: run(h, w, args, *active), w, h, args)
        leaves, treedef = jax.tree.flatten(pullback)
        slot = {id(x): k for k, x in enumerate(jax.tree.leaves(w))}
        layout.update(treedef=treedef, slots=[slot.get(id(x)) for x in leaves])
        return out, (params, chunk, [x for x in leaves if id(x) not in slot])

    def backward(saved, cotangent):
        params, chunk, kept = saved
        w, kept = jax.tree.leaves(take(params, chunk, size)), iter(kept)
        pullback = jax.tree.unflatten(
            layout["treedef"], [next(kept) if k is None else w[k] for k in layout["slots"]])
        dw, dh, dargs = pullback(cotangent)
        dparams = jax.tree.map(lambda a, g: lax.dynamic_update_slice_in_dim(
            jnp.zeros_like(a), g.astype(a.dtype), chunk * size, 0), params, dw)
        return dparams, dh, dargs, None, None

    chunked.defvjp(forward, backward)
    return chunked(params, h, list(args), chunk, tuple(active))

