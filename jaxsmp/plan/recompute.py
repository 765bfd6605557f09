"""What a remat policy runs again: the share of a layer's forward GEMM FLOPs its backward
pass recomputes, counted in the program JAX emits for it.

JAX recomputes only what the backward pass reads (its remat transform drops the rest, and
XLA would too): a layer's last projection, whose output only feeds the residual sum, is
not run again. So ``remat="full"`` recomputes 7/12 of GPT-NeoX's GEMMs (parallel
residual: neither the attention output nor the MLP output projection), 2/3 of Bloom's
and about 0.78 of Llama's (not the MLP's down projection), and not a whole forward.
Measured on one H200 (GPT-NeoX 1.3b, seq 2048, ``bench/results/2026-11-27-nvidia-h200``):
``full`` costs 7% more than ``none``, where a whole forward again would cost 27%.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import jax
from jax._src import core

# the GEMMs counted: the layers' Linears (dot_general without batch dimensions) and a
# mixture of experts' grouped GEMMs; attention's score matmuls (batched over heads)
# are not, whatever the policy, attention is recomputed unless its output is saved
_RAGGED = ("ragged_dot", "ragged_dot_general")


def _dot_flops(eqn) -> float:
    lhs = eqn.invars[0].aval
    if eqn.primitive.name == "dot_general":
        (contract, _), (batch, _) = eqn.params["dimension_numbers"]
        if batch:
            return 0.0
        return 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(
            lhs.shape[i] for i in contract)
    # grouped (a forward ragged_dot and both its transposes): each row of lhs meets one
    # group's weights, out's last dimension wide
    return 2.0 * math.prod(lhs.shape) * eqn.outvars[0].aval.shape[-1]


def matmul_flops(jaxpr) -> float:
    """FLOPs of the Linears' GEMMs in ``jaxpr`` and every jaxpr inside it (a scan's body
    times its length)."""
    total = 0.0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general" or eqn.primitive.name in _RAGGED:
            total += _dot_flops(eqn)
        times = eqn.params.get("length", 1) if eqn.primitive.name == "scan" else 1
        for inner in core.jaxprs_in_params(eqn.params):
            total += times * matmul_flops(getattr(inner, "jaxpr", inner))
    return total


def layer_matmul_flops(layer_loss: Callable[[str], tuple[Callable, tuple]], policy: str,
                       grad: bool) -> float:
    """The Linears' GEMM FLOPs of one layer's forward (``grad`` False) or forward and
    backward under ``policy``: ``layer_loss(policy)`` gives a loss of the layer's output
    under that policy and its abstract arguments."""
    loss, arguments = layer_loss(policy)
    fn = jax.grad(loss, argnums=(0, 1)) if grad else loss
    return matmul_flops(jax.make_jaxpr(fn)(*arguments).jaxpr)


def recomputed_share(counted: Callable[[str, bool], float], remat: str) -> float:
    """The GEMM FLOPs the backward pass of one layer under ``remat`` runs beyond
    ``none``'s, over its forward's; ``counted(policy, grad)``: :func:`layer_matmul_flops`."""
    if remat == "none":
        return 0.0
    if remat == "offload":   # save_matmuls' program, its residuals in host memory
        remat = "save_matmuls"
    return (counted(remat, True) - counted("none", True)) / counted("none", False)
