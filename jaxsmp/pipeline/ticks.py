"""What 1F1B's two runners share: the stack hooks that take the user's loss apart, the
state a tick carries, and its switch.

:class:`~jaxsmp.pipeline.one_f_one_b.OneFOneB` runs the schedule's table tick by tick;
:class:`~jaxsmp.pipeline.fused_ticks.FusedOneFOneB` (under ``tp``) fuses its ticks.
:mod:`jaxsmp.train.stage_costs` uses the hooks to cost a stage and the head apart.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jaxsmp.nn.stack import require_one_array


class RecordStack:
    """Stack hook recording the layer function, input, parameters and arguments."""

    def __call__(self, run, x, params, args):
        require_one_array(x, "1F1B (pipeline='interleaved')",  # its ticks and their costing
                          "use pipeline='simple' or 'virtual'")
        self.run, self.x, self.params, self.args = run, x, params, args
        return x


class StackOutput:
    """Stack hook whose output is a given value (the input is unused)."""

    def __init__(self, y: jax.Array):
        self.y = y

    def __call__(self, run, x, params, args):
        return self.y


class Buffers(NamedTuple):
    incoming: jax.Array   # [p, ...] activations received, by microbatch slot
    cotangents: jax.Array  # [p, ...] output cotangents received (or from the head)
    inputs: jax.Array     # [p, ...] stage inputs kept for the backward recompute
    input_grads: jax.Array  # [m, ...] cotangents of the stack input (stage 0)


class Sums(NamedTuple):
    layers: Any   # gradients of the stage's stacked layers
    top: Any      # gradients of every parameter through the head (last stage)
    loss: jax.Array
    metrics: dict


class Messages(NamedTuple):
    forward: jax.Array
    forward_tag: jax.Array   # microbatch + 1, 0: nothing sent
    backward: jax.Array
    backward_tag: jax.Array


def put(buf: jax.Array, when: jax.Array, value: jax.Array, slot: jax.Array) -> jax.Array:
    """``buf[slot] = value`` if ``when``, updating one slot in place."""
    return lax.dynamic_update_index_in_dim(buf, jnp.where(when, value, buf[slot]), slot, 0)


def choose(index: jax.Array, branches: list[Callable], *args, branchless: bool):
    """``lax.switch``, or with ``branchless`` every branch computed and one selected
    (needed when GSPMD places collectives of automatic axes such as ``tp`` inside the
    branches: they span all devices, so every device must run them)."""
    if not branchless:
        return lax.switch(index, branches, *args)
    outs = [branch(*args) for branch in branches]
    return jax.tree.map(lambda *xs: lax.select_n(index, *xs), *outs)


def accumulator(maxima: list[bool]) -> Callable:
    """Adds a tree of gradients to a running total leaf by leaf, taking the maximum
    where ``maxima`` says so: fp8 amax observations (``Fp8Meta`` cotangents, which come
    out of the Stack's ``max_accumulating`` cast as Flax's ``fm32``), which a sum over
    microbatches would add up."""
    def accumulate(total: Any, new: Any) -> Any:
        leaves = [jnp.maximum(a, lax.convert_element_type(b, a.dtype)) if m else a + b
                  for a, b, m in
                  zip(jax.tree.leaves(total), jax.tree.leaves(new), maxima, strict=True)]
        return jax.tree.unflatten(jax.tree.structure(total), leaves)
    return accumulate
