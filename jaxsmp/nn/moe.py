"""A mixture-of-experts SwiGLU block: top-k router, dropless grouped GEMMs.

Routing (Mixtral's): ``probs = softmax(router logits)``; each token goes to its
``top_k`` most probable experts, weighted by the softmax over the chosen experts'
logits (the chosen probabilities renormalised to sum to 1).

Compute (dropless): the ``tokens x top_k`` assignments are sorted by expert and each
expert's SwiGLU runs as one grouped GEMM over its contiguous rows
(``jax.lax.ragged_dot`` with the per-expert group sizes); the outputs are weighted and
summed back to their tokens. With ``capacity_factor`` each expert keeps at most
``ceil(capacity_factor * tokens * top_k / num_experts)`` assignments, the earliest
tokens first (Switch); the rest contribute nothing to the output and are counted
(``dropped``). The grouped GEMMs still run over every assignment: the option changes
the result, not the compute.

With expert parallelism (the step's :class:`~jaxsmp.nn.LayerContext` names an
``expert_axis``) the layer holds only its device's experts, and the assignments travel
to their experts' devices and back by all-to-all (:mod:`jaxsmp.nn.moe_dispatch`).

Router statistics travel through a :class:`~jaxsmp.nn.Stack` in the layer carry (a
:func:`router_stats` dict, one row of ``load`` per layer), so that the model can
return the auxiliary losses of :func:`router_losses` from the whole stack.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxsmp.nn.layer_context import current_layer_context
from jaxsmp.nn.linear import Linear
from jaxsmp.nn.moe_dispatch import expert_parallel, grouped_swiglu
from jaxsmp.nn.param import logical_param

Stats = dict[str, jax.Array]


def router_stats(num_layers: int, num_experts: int, like: jax.Array) -> Stats:
    """Zeroed statistics for a stack of ``num_layers`` MoE layers. ``like`` (the hidden
    state) only types them: inside the step's ``shard_map`` they vary as it does."""
    zero = jnp.zeros((), jnp.float32) * like.reshape(-1)[0].astype(jnp.float32)
    return {"load": jnp.zeros((num_layers, num_experts), jnp.float32) + zero,
            "probs": jnp.zeros((num_experts,), jnp.float32) + zero,
            "z": zero, "dropped": zero}


def router_losses(stats: Stats, num_tokens: int, top_k: int) -> dict[str, jax.Array]:
    """The Switch/Mixtral load-balancing loss ``E * sum_e f_e * P_e`` (``f_e``: the
    fraction of tokens that chose expert ``e`` among their top-k, ``P_e``: its mean
    router probability, both over all layers' tokens together, as transformers'
    ``load_balancing_loss_func`` computes them), the router z-loss (the mean squared
    log-sum-exp of the router logits, ST-MoE), ``dropped_tokens`` and ``expert_load``
    (each layer's share of assignments per expert). ``num_tokens``: tokens per layer.

    Over the global batch: inside a step the statistics and token counts are first
    summed over the data devices (``LayerContext.sum_over_data``), so that every device
    computes the batch's loss, and its gradient reaches each device's router through
    the sum's transpose."""
    count = jnp.zeros((), jnp.float32) * stats["z"] + num_tokens  # typed like the stats
    stats, count = current_layer_context().sum_over_data((stats, count))
    layers, experts = stats["load"].shape
    n = layers * count
    f = jax.lax.stop_gradient(stats["load"]).sum(0) / n
    return {"aux_loss": experts * jnp.sum(f * stats["probs"] / n),
            "z_loss": stats["z"] / n, "dropped_tokens": stats["dropped"],
            "expert_load": stats["load"] / (count * top_k)}


def capacity(capacity_factor: float, num_tokens: int, top_k: int, num_experts: int) -> int:
    """Assignments each expert keeps under ``capacity_factor``."""
    return math.ceil(capacity_factor * num_tokens * top_k / num_experts)


class MoE(nnx.Module):
    """``num_experts`` SwiGLU experts of width ``intermediate``; parameters
    ``gate`` (the router, ``[embed, experts]``) and ``gate_proj``/``up_proj``
    ``[experts, embed, mlp]``, ``down_proj`` ``[experts, mlp, embed]``."""

    def __init__(self, dim: int, intermediate: int, num_experts: int, top_k: int, *,
                 rngs: nnx.Rngs, init_std: float = 0.02,
                 capacity_factor: float | None = None):
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok {top_k} must be in 1..{num_experts} "
                             f"(num_local_experts)")
        if capacity_factor is not None and not capacity_factor > 0:
            raise ValueError(f"capacity_factor must be > 0 or None (dropless), got "
                             f"{capacity_factor}")
        self.top_k, self.capacity_factor = top_k, capacity_factor
        self.gate = Linear(dim, num_experts, in_axis="embed", out_axis="router",
                           use_bias=False, rngs=rngs, init_std=init_std)
        init = nnx.initializers.normal(init_std)
        self.gate_proj = logical_param(rngs, init, (num_experts, dim, intermediate),
                                       ("experts", "embed", "mlp"))
        self.up_proj = logical_param(rngs, init, (num_experts, dim, intermediate),
                                     ("experts", "embed", "mlp"))
        self.down_proj = logical_param(rngs, init, (num_experts, intermediate, dim),
                                       ("experts", "mlp", "embed"))

    def route(self, t: jax.Array):
        """(router logits float32 ``[T, E]``, chosen experts ``[T, k]``, their weights)."""
        logits = self.gate(t).astype(jnp.float32)
        top, chosen = jax.lax.top_k(logits, self.top_k)
        return logits, chosen, jax.nn.softmax(top, axis=-1)

    def __call__(self, x: jax.Array, stats: Stats) -> tuple[jax.Array, Stats]:
        ctx = current_layer_context()
        if ctx.fp8:
            raise ValueError("precision='fp8' has no float8 grouped GEMM for a mixture of "
                             "experts yet; use precision='bf16'")
        b, s, d = x.shape
        t = x.reshape(b * s, d)
        logits, chosen, weights = self.route(t)
        num_experts = logits.shape[-1]
        cap = None if self.capacity_factor is None else capacity(
            self.capacity_factor, b * s, self.top_k, num_experts)
        w1, w3, w2 = self.gate_proj[...], self.up_proj[...], self.down_proj[...]
        if ctx.expert_axis is None:
            out, sizes, dropped = self._local(t, chosen, weights, w1, w3, w2, cap)
        else:
            out, sizes, dropped = expert_parallel(t, chosen, weights, w1, w3, w2,
                                                  ctx.expert_axis, num_experts, cap)
        probs = jax.nn.softmax(logits, axis=-1)
        stats = {"load": jnp.roll(stats["load"], -1, axis=0).at[-1].set(
                     sizes.astype(jnp.float32)),
                 "probs": stats["probs"] + probs.sum(0),
                 "z": stats["z"] + jnp.sum(jnp.square(jax.nn.logsumexp(logits, axis=-1))),
                 "dropped": stats["dropped"] + dropped}
        return out.reshape(b, s, d).astype(x.dtype), stats

    def _local(self, t, chosen, weights, w1, w3, w2, cap: int | None):
        """(float32 outputs, assignments per expert, dropped) with every expert local."""
        num_experts, k = w1.shape[0], self.top_k
        flat = chosen.reshape(-1)
        order = jnp.argsort(flat, stable=True)     # assignments grouped by expert
        sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
        token = order // k
        y = grouped_swiglu(t[token], sizes, w1, w3, w2)
        scale = weights.reshape(-1)[order]
        dropped = jnp.zeros((), jnp.float32)
        if cap is not None:
            starts = jnp.cumsum(sizes) - sizes
            keep = jnp.arange(flat.shape[0]) - starts[flat[order]] < cap
            scale = jnp.where(keep, scale, 0.0)
            dropped = jnp.sum(~keep).astype(jnp.float32)
        out = jax.ops.segment_sum(y.astype(jnp.float32) * scale[:, None], token,
                                  num_segments=t.shape[0])
        return out, sizes, dropped
