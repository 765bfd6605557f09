"""The residuals one stacked layer keeps for its backward pass, as the step keeps them.

JAX's residuals of the layer's vjp (what ``saved_residuals`` lists) with two
corrections, each something the step's program does and a plain list of a layer's vjp
does not:

- Only the layer's parameters and its carry are differentiated. The extra arguments a
  model passes every layer (rotary tables) are constants of the step's loss, so nothing
  is kept for their gradients (a vjp in them as well kept float32 copies of q and k).
- Residuals that compute the same value from the same inputs are counted once: XLA's
  common-subexpression pass merges them before buffers are assigned (a parallel-residual
  layer normalises its input twice, once per branch, with the same statistics).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax.extend import core as jcore


def layer_residuals(loss: Callable, layer: Any, carry: Any, extra: Any
                    ) -> list[tuple[jax.ShapeDtypeStruct, str]]:
    """(abstract value, where it comes from) of each residual that ``loss(layer, carry,
    extra)`` keeps for its gradient in ``layer`` and ``carry`` (abstract values), with
    the residuals that XLA's CSE merges listed once. A source reads ``argument layer``,
    ``argument h<i>`` (a leaf of the carry), ``argument extra`` or ``output of <the
    primitive>`` (``scan`` for a stacked layer's own)."""
    def vjp(layer, carry, extra):
        return jax.vjp(lambda p, h: loss(p, h, extra), layer, carry)

    closed, out_shape = jax.make_jaxpr(vjp, return_shape=True)(layer, carry, extra)
    jaxpr = closed.jaxpr
    num_res = len(jax.tree.leaves(out_shape[1]))
    canonical = _canonical_outputs(jaxpr)
    names = (["layer"] * len(jax.tree.leaves(layer))
             + [f"h{i}" for i in range(len(jax.tree.leaves(carry)))]
             + ["extra"] * len(jax.tree.leaves(extra)))
    sources = {v: f"argument {n}" for v, n in zip(jaxpr.invars, names)}
    sources.update({v: f"output of {e.primitive.name}" for e in jaxpr.eqns for v in e.outvars})
    seen, kept = set(), []
    for v in jaxpr.outvars[len(jaxpr.outvars) - num_res:]:
        if isinstance(v, jcore.Literal):
            continue   # a constant, nothing kept per token
        key = canonical.get(v, v)
        if key not in seen:
            seen.add(key)
            kept.append((jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype),
                         sources.get(v, "a constant")))
    return kept


def _canonical_outputs(jaxpr: jcore.Jaxpr) -> dict:
    """For each output of a ``scan`` equation (where a stacked layer's residuals come
    from), a key shared by the outputs whose body computes the same value from the same
    inputs: a value numbering of the body, as XLA's CSE would merge it."""
    keys: dict = {}
    for eqn in jaxpr.eqns:
        if eqn.primitive.name != "scan":
            continue
        body = eqn.params["jaxpr"].jaxpr
        numbering = _value_numbers(body)
        for out, inner in zip(eqn.outvars, body.outvars):
            keys[out] = (id(eqn), numbering.get(inner, inner))
    return keys


def _value_numbers(jaxpr: jcore.Jaxpr) -> dict:
    """A key per variable of ``jaxpr``: equal for two variables computed by the same
    primitive with the same parameters from equal inputs. Effectful equations are never
    merged."""
    number: dict = {}

    def of(x):
        if isinstance(x, jcore.Literal):
            return ("literal", repr(x.val), str(x.aval))
        return number.get(x, x)

    for eqn in jaxpr.eqns:
        if eqn.effects:
            continue
        key = (eqn.primitive.name, _params_key(eqn.params), tuple(of(x) for x in eqn.invars))
        for i, out in enumerate(eqn.outvars):
            number[out] = (key, i)
    return number


def _params_key(params: dict) -> str:
    # a jaxpr-valued parameter prints as its program; equal programs print alike
    return repr(sorted((k, str(v)) for k, v in params.items()))
