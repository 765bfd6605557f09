"""How one training step runs the layer stack: the pipeline plan, built once.

:class:`PipelinePlan` takes the mesh's ``pp`` degree, the schedule, the microbatch
count, the virtual chunks and the stack's depth, checks them together, and then owns
everything that depends on them: the order of the stacked layers on the stages, the
stage runner the :class:`~jaxsmp.nn.Stack` calls, and the gradient computation of
the step (plain microbatch accumulation when ``pp == 1``, autodiff of the GPipe and
circular runners, the hand-driven 1F1B schedule).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxsmp.checks import positive_int
from jaxsmp.pipeline.fused_ticks import FusedOneFOneB
from jaxsmp.pipeline.layout import StageLayout, check_counts, equal_counts
from jaxsmp.pipeline.microbatch import one_at_a_time, split_microbatches
from jaxsmp.pipeline.one_f_one_b import OneFOneB
from jaxsmp.pipeline.runner import StageRunner
from jaxsmp.pipeline.schedule import SCHEDULES, check_microbatches

# forward(params, batch, stage_runner) -> (loss, metrics), the stage runner being the
# Stack's hook (None: a plain scan over the local layers)
Forward = Callable[[nnx.State, Any, Any], tuple[jax.Array, dict]]


@dataclass(frozen=True)
class PipelinePlan:
    """``stages`` = the mesh's ``pp``; ``schedule``: ``simple``, ``interleaved`` (1F1B)
    or ``virtual`` (``virtual_chunks`` per stage; Megatron calls this "interleaved");
    ``num_layers``: the stack's depth (None: checked when the stack is seen);
    ``partition``: ``"equal"`` or layers per virtual stage (``pp x chunks`` counts,
    chunk ``c`` of stage ``s`` being virtual stage ``c * pp + s``); ``spread_head``
    (1F1B): every stage runs the head on its share of each microbatch."""
    stages: int = 1
    schedule: str = "simple"
    microbatches: int = 1
    virtual_chunks: int = 2
    num_layers: int | None = None
    partition: str | tuple[int, ...] = "equal"
    spread_head: bool = False
    axis: str = "pp"

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown pipeline schedule {self.schedule!r}; valid: {SCHEDULES}")
        for name in ("stages", "microbatches", "virtual_chunks"):
            positive_int(name, getattr(self, name))
        if self.stages > 1:
            check_microbatches(self.schedule, self.stages, self.microbatches)
            if self.num_layers is not None:
                self.layout()  # raises if the layers do not split into the stages
        if self.spread_head and (self.stages == 1 or self.schedule != "interleaved"):
            raise ValueError(f"pipeline_head='spread' spreads the head over pipeline stages, "
                             f"but the mesh has pp={self.stages}; use pp > 1 or "
                             f"pipeline_head='auto'")
        if self.stages == 1 and self.partition != "equal":
            raise ValueError(f"pipeline_partition={self.partition!r} splits layers over "
                             f"pipeline stages, but the mesh has pp=1; use pp > 1")

    @property
    def chunks(self) -> int:
        return self.virtual_chunks if self.stages > 1 and self.schedule == "virtual" else 1

    def layout(self) -> StageLayout | None:
        """Which layers each stage runs (None: no pipeline, or the depth is unknown)."""
        if self.stages == 1 or self.num_layers is None:
            return None
        if self.partition == "equal":
            counts = equal_counts(self.num_layers, self.stages, self.chunks)
        else:
            counts = check_counts(self.partition, self.num_layers, self.stages, self.chunks)
        return StageLayout(counts, self.stages, self.chunks)

    def active(self) -> tuple[tuple[int, ...], ...] | None:
        """``[stage][chunk]`` layers run when stages are padded (None: all slots run)."""
        layout = self.layout()
        if layout is None or not layout.padded:
            return None
        return tuple(tuple(int(n) for n in row) for row in layout.active())

    def to_stages(self, params: nnx.State) -> nnx.State:
        layout = self.layout()
        return params if layout is None else layout.to_stages(params)

    def from_stages(self, grads: nnx.State, params: nnx.State) -> nnx.State:
        layout = self.layout()
        return grads if layout is None else layout.from_stages(grads, params)

    def runner(self, evaluate: bool = False) -> StageRunner | None:
        """The stage runner of the autodiff schedules (None: no pipeline, or 1F1B when
        training; evaluation runs 1F1B's layout through GPipe's forward)."""
        if self.stages == 1 or (self.schedule == "interleaved" and not evaluate):
            return None
        return StageRunner(self.stages, self.microbatches, self.chunks, self.axis,
                           self.active())

    def gradients(self, forward: Forward, params: nnx.State, batch: Any, coef: jax.Array,
                  *, branchless: bool = False):
        """(float32 gradients of ``coef`` x the mean loss of the local batch, mean loss,
        mean metrics) on this device's parameters."""
        if self.stages > 1 and self.schedule == "interleaved":
            # 1F1B by hand; with branchless (tp) its ticks fused, so that no stage takes
            # a branch the others do not (GSPMD's tp collectives sit in the layers)
            kind = FusedOneFOneB if branchless else OneFOneB
            return kind(forward, params, batch, coef / self.microbatches, stages=self.stages,
                        microbatches=self.microbatches, axis=self.axis,
                        branchless=branchless, active=self.active(),
                        spread_head=self.spread_head).gradients(params)
        runner = self.runner()
        m = 1 if runner else self.microbatches  # a pipeline splits inside the stack

        def micro(acc, mbatch):
            if m > 1:   # accumulation (a pipeline's one call runs its own schedule)
                acc, mbatch = one_at_a_time(acc, mbatch)

            def scaled_loss(p):
                loss, metrics = forward(p, mbatch, runner)
                return loss * coef / m, (loss, metrics)
            grads, aux = jax.grad(scaled_loss, has_aux=True)(params)
            return jax.tree.map(lambda a, g: a + g.astype(jnp.float32), acc, grads), aux

        zeros = jax.tree.map(lambda x: jnp.zeros_like(x, jnp.float32), params)
        grads, (losses, metrics) = jax.lax.scan(micro, zeros, split_microbatches(batch, m))
        return grads, losses.mean(), jax.tree.map(lambda x: x.mean(0), metrics)

    def evaluate(self, forward: Forward, params: nnx.State, batch: Any):
        """(loss, metrics) of a forward pass; ``params`` in the stage layout
        (:meth:`to_stages`), run by GPipe's forward (circular for ``virtual``)."""
        return forward(params, batch, self.runner(evaluate=True))
