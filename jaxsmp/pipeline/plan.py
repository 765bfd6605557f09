"""How one training step runs the layer stack: the pipeline plan, built once.

:class:`PipelinePlan` takes the mesh's ``pp`` degree, the schedule, the microbatch
count, the virtual chunks and the stack's depth, checks them together, and then owns
everything that depends on them: the order of the stacked layers on the stages, the
stage runner the :class:`~jaxsmp.nn.Stack` calls, and the gradient computation of
the step (plain microbatch accumulation when ``pp == 1``, autodiff of the GPipe and
circular runners, the hand-driven 1F1B schedule).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxsmp.pipeline import one_f_one_b
from jaxsmp.pipeline.layout import inverse, permute_stacked, virtual_layer_order
from jaxsmp.pipeline.microbatch import split_microbatches
from jaxsmp.pipeline.runner import StageRunner
from jaxsmp.pipeline.schedule import SCHEDULES, check_microbatches

# forward(params, batch, stage_runner) -> (loss, metrics), the stage runner being the
# Stack's hook (None: a plain scan over the local layers)
Forward = Callable[[nnx.State, Any, Any], tuple[jax.Array, dict]]


def _positive(name: str, value) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class PipelinePlan:
    """``stages`` = the mesh's ``pp``; ``schedule``: ``simple``, ``interleaved`` (1F1B)
    or ``virtual`` (``virtual_chunks`` per stage; Megatron calls this "interleaved");
    ``num_layers``: the stack's depth (None: checked when the stack is seen)."""
    stages: int = 1
    schedule: str = "simple"
    microbatches: int = 1
    virtual_chunks: int = 2
    num_layers: int | None = None
    axis: str = "pp"

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown pipeline schedule {self.schedule!r}; valid: {SCHEDULES}")
        for name in ("stages", "microbatches", "virtual_chunks"):
            _positive(name, getattr(self, name))
        if self.stages > 1:
            check_microbatches(self.schedule, self.stages, self.microbatches)
            if self.num_layers is not None:
                self.layer_order()  # raises if the layers do not split into the chunks

    @property
    def chunks(self) -> int:
        return self.virtual_chunks if self.stages > 1 and self.schedule == "virtual" else 1

    def layer_order(self) -> np.ndarray | None:
        """The permutation of the stacked layers the stages run (None: stored order)."""
        if self.chunks == 1 or self.num_layers is None:
            return None
        return virtual_layer_order(self.num_layers, self.stages, self.chunks)

    def to_stages(self, params: nnx.State) -> nnx.State:
        order = self.layer_order()
        return params if order is None else permute_stacked(params, params, order)

    def from_stages(self, grads: nnx.State, params: nnx.State) -> nnx.State:
        order = self.layer_order()
        return grads if order is None else permute_stacked(grads, params, inverse(order))

    def runner(self) -> StageRunner | None:
        """The stage runner of the autodiff schedules (None: no pipeline, or 1F1B)."""
        if self.stages == 1 or self.schedule == "interleaved":
            return None
        return StageRunner(self.stages, self.microbatches, self.chunks, self.axis)

    def gradients(self, forward: Forward, params: nnx.State, batch: Any, coef: jax.Array,
                  *, branchless: bool = False):
        """(float32 gradients of ``coef`` x the mean loss of the local batch, mean loss,
        mean metrics) on this device's parameters."""
        if self.stages > 1 and self.schedule == "interleaved":
            return one_f_one_b.gradients(forward, params, batch, coef / self.microbatches,
                                         stages=self.stages,
                                         microbatches=self.microbatches, axis=self.axis,
                                         branchless=branchless)
        runner = self.runner()
        m = 1 if runner else self.microbatches  # a pipeline splits inside the stack

        def micro(acc, mbatch):
            def scaled_loss(p):
                loss, metrics = forward(p, mbatch, runner)
                return loss * coef / m, (loss, metrics)
            grads, aux = jax.grad(scaled_loss, has_aux=True)(params)
            return jax.tree.map(lambda a, g: a + g.astype(jnp.float32), acc, grads), aux

        zeros = jax.tree.map(lambda x: jnp.zeros_like(x, jnp.float32), params)
        grads, (losses, metrics) = jax.lax.scan(micro, zeros, split_microbatches(batch, m))
        return grads, losses.mean(), jax.tree.map(jnp.mean, metrics)

    def evaluate(self, forward: Forward, params: nnx.State, batch: Any):
        """(loss, metrics) of a forward pass over the stored layer order (GPipe)."""
        runner = None if self.stages == 1 else StageRunner(self.stages, self.microbatches)
        return forward(params, batch, runner)
