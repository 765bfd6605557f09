"""What the training step tells every stacked layer: how to gather it, how to remat it.

Models never see meshes or collectives. ``jaxsmp.step`` installs a context whose
``scan_layers`` runs a :class:`~jaxsmp.nn.Stack`'s layers with ZeRO-3 gathering (one
layer at a time, the next prefetched), remat and hand-written backward; outside a
step the defaults make a Stack a plain scan.
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

import pallas_kernels
from jaxsmp.nn.remat import remat


def plain_scan(apply: Callable, h: Any, params: nnx.State, args, *,
               remat_policy: str = "none", active: jax.Array | None = None) -> Any:
    """``apply(layer_params, h, args)`` over the stacked layers in ``params``, in one
    ``lax.scan``, each layer under the remat policy (outside a step: no gathering);
    with ``active`` only the first ``active`` layers run, the others pass ``h`` on."""
    def body(carry, xs):
        one, i = xs
        if active is None:
            return apply(one, carry, args), None
        return jax.lax.cond(i < active, lambda: apply(one, carry, args), lambda: carry), None
    n = jax.tree.leaves(params)[0].shape[0]
    return jax.lax.scan(remat(body, remat_policy), h, (params, jnp.arange(n)))[0]


def local_linear(in_axis: str, out_axis: str, x, matmul: Callable, bias):
    """A Linear on this device's batch: ``matmul(x) + bias``."""
    return matmul(x) if bias is None else matmul(x) + bias


@dataclass(frozen=True)
class LayerContext:
    # ``scan_layers(apply, h, params, args[, active=n])``: how a Stack runs its local
    # layers (only the first n with ``active``); the step installs ZeRO-3 gathering with
    # remat and prefetch (jaxsmp.train.layer_scan).
    scan_layers: Callable[..., Any] = plain_scan
    # With pp > 1: ``run_stages(run, x, params, args)`` runs the stage's local layers in
    # a pipeline schedule (see jaxsmp.pipeline.runner.StageRunner); None: a plain scan.
    run_stages: Callable[..., Any] | None = None
    # ``embed_lookup(table, tokens)``: an Embed's rows computed without its full table
    # (jaxsmp.train.embed_lookup), or None to use the table as it is.
    embed_lookup: Callable[[nnx.Variable, Any], Any] = lambda table, tokens: None
    # ``attention(q, k, v, **kwargs)``: pallas_kernels.attention, or the step's version
    # on each device's local batch and heads (jaxsmp.train.attention).
    attention: Callable[..., jax.Array] = pallas_kernels.attention
    # Linears holding amax histories run their matmul in float8 (precision="fp8")
    fp8: bool = False
    # The manual mesh axis a mixture of experts' experts are split over (expert
    # parallelism): its layer holds only its local experts and sends each token to its
    # experts' devices by all-to-all (jaxsmp.nn.moe_dispatch); None: all experts local.
    expert_axis: str | None = None
    # ``sum_over_data(tree)``: a tree of per-device statistics summed over the step's
    # data devices (a psum over its manual data axes), so that a loss of batch
    # statistics (the load-balancing loss) is the global batch's; identity outside a step.
    sum_over_data: Callable[[Any], Any] = lambda tree: tree
    # ``linear(in_axis, out_axis, x, matmul, bias)``: how a Linear with those logical axes
    # runs ``matmul(x) + bias``; the step's may run it over the sdp group's gathered
    # batch with the weight left split (jaxsmp.train.activation_gather).
    linear: Callable[..., Any] = local_linear


_CURRENT = contextvars.ContextVar("jaxsmp_layer_context", default=LayerContext())


def current_layer_context() -> LayerContext:
    return _CURRENT.get()


@contextlib.contextmanager
def layer_context(ctx: LayerContext) -> Iterator[LayerContext]:
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)
