"""``@jaxsmp.step``: a user loss function becomes a compiled, sharded training step.

One pass, config -> mesh -> plan -> shard_map -> update:

1. :class:`~jaxsmp.pipeline.PipelinePlan` (built once per state) orders the stacked
   layers for the pipeline stages and computes the gradients on each device.
2. Inside one ``shard_map`` manual over the data and pipeline axes
   (:mod:`jaxsmp.train.manual`): parameters marked per replica -> the plan's gradients
   of the local loss (:mod:`jaxsmp.train.forward` gathers shards over ``sdp``; every
   gather's gradient is the matching reduce-scatter) -> one float32 sum over the data
   replicas -> losses averaged.
3. The optimizer updates the sharded float32 master parameters
   (:mod:`jaxsmp.train.update`) outside the ``shard_map``.
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import PartitionSpec as P

from jaxsmp.nn.param import is_var, logical_axes
from jaxsmp.nn.remat import check_offloads
from jaxsmp.nn.stack import is_stacked
from jaxsmp.pipeline.layout import check_enough
from jaxsmp.pipeline.plan import PipelinePlan
from jaxsmp.train import activation_gather, fp8_state, manual, stage_costs
from jaxsmp.train.batch import place_batch
from jaxsmp.train.explain import Explanation, explain_step
from jaxsmp.train.first_run import FirstRuns
from jaxsmp.train.forward import LossFn, local_forward
from jaxsmp.train.options import StepOptions
from jaxsmp.train.precision import precision_policy
from jaxsmp.train.state import TrainState, state_shardings
from jaxsmp.train.update import apply_gradients


def _plan(state: TrainState, options: StepOptions, partition: Any = None,
          spread_head: bool | None = None) -> PipelinePlan:
    """The pipeline plan; settings the mesh cannot serve fail here, before compiling.
    ``partition``, ``spread_head``: the resolved ``pipeline_partition`` and
    ``pipeline_head`` (None: the options'; ``auto``'s are only known when the step is
    traced, so its layout is not checked)."""
    if options.sequence_parallel and state.mesh.tp == 1:
        raise ValueError("sequence_parallel=True splits activations over tp, but the mesh "
                         "has tp=1; use a mesh with tp > 1 or sequence_parallel=False")
    if options.context_parallel != "auto" and state.mesh.cp == 1:
        raise ValueError(f"context_parallel={options.context_parallel!r} splits sequences over "
                         f"cp, but the mesh has cp=1; use a mesh with cp > 1 or the default")
    why = activation_gather.unsupported(dict(state.mesh.jax_mesh.shape), options)
    if options.activation_gather == "always" and why:
        raise ValueError(f"activation_gather='always' keeps the MLP and vocabulary weights "
                         f"split over sdp alone, but {why}; use 'auto' or 'never'")
    if state.mesh.cp > 1 and state.mesh.pp > 1:
        raise ValueError(f"context parallelism (cp={state.mesh.cp}) with pipeline parallelism "
                         f"(pp={state.mesh.pp}) is not supported yet; use pp=1 or cp=1")
    num_layers = _num_layers(state)
    partition = options.pipeline_partition if partition is None else partition
    auto = partition == "auto" and state.mesh.pp > 1  # the split needs the batch's shapes
    plan = PipelinePlan(stages=state.mesh.pp, schedule=options.pipeline,
                        microbatches=options.microbatches,
                        virtual_chunks=options.virtual_chunks,
                        num_layers=None if auto else num_layers,
                        partition="equal" if partition == "auto" else partition,
                        spread_head=(options.pipeline_head == "spread" if spread_head is None
                                     else spread_head))
    if auto and num_layers is not None:
        check_enough(num_layers, plan.stages, plan.chunks)
    return plan


def _num_layers(state: TrainState) -> int | None:
    stacked = [v for v in jax.tree.leaves(state.params, is_leaf=is_var) if is_stacked(v)]
    return stacked[0].shape[0] if stacked else None


def _vocab_size(state: TrainState) -> int | None:
    """Rows of the model's token embedding (a ``("vocab", "embed")`` parameter), if any."""
    sizes = {v.shape[0] for v in jax.tree.leaves(state.params, is_leaf=is_var)
             if logical_axes(v) == ("vocab", "embed")}
    return min(sizes) if sizes else None


class _Step:
    """What the train and eval steps share: options, plan, placing the batch."""

    def __init__(self, fn: LossFn, options: StepOptions):
        self.fn, self.options = fn, options
        self._partitions: dict = {}  # auto's (split, head, why) per state and batch shapes
        functools.update_wrapper(self, fn)

    def _prepare(self, state: TrainState, batch: Any,
                 microbatches: int) -> tuple[TrainState, Any, PipelinePlan]:
        """What every call does before tracing: settings the mesh cannot serve fail,
        fp8 histories are added, the batch is placed, and the pipeline plan is resolved
        for its shapes (``auto``'s split costed). The step traces with that plan."""
        _plan(state, self.options)
        state = self._with_fp8(state)
        batch = self._place(state, batch, microbatches)
        return state, batch, self._resolved_plan(state, batch)

    def _collectives(self, state: TrainState) -> str:
        return self.options.collectives or state.mesh.collectives

    def _forward(self, state: TrainState):
        return local_forward(self.fn, state.graphdef, self.options, self._collectives(state),
                             state.mesh.jax_mesh)

    def _place(self, state: TrainState, batch: Any, microbatches: int) -> Any:
        return place_batch(batch, state.mesh, microbatches, _vocab_size(state))

    def _resolved_plan(self, state: TrainState, batch: Any) -> PipelinePlan:
        """The plan, ``pipeline_partition`` and ``pipeline_head`` resolved for
        ``batch``'s shapes."""
        return _plan(state, self.options, *self._split(state, batch))

    def pipeline_partition(self, state: TrainState, batch: Any) -> str | tuple[int, ...]:
        """The layers per (virtual) pipeline stage this step runs on ``batch`` (placed
        or not; arrays or shapes): ``"equal"`` or the counts, ``auto`` resolved from
        compiled costs (:mod:`jaxsmp.train.stage_costs`)."""
        return self._split(state, batch)[0]

    def pipeline_head(self, state: TrainState, batch: Any) -> str:
        """Where this step runs the head on ``batch``: ``"last"`` or ``"spread"``."""
        return "spread" if self._split(state, batch)[1] else "last"

    def _split(self, state: TrainState, batch: Any) -> tuple[str | tuple[int, ...], bool]:
        """(pipeline_partition, spread_head), ``auto`` resolved from compiled costs."""
        return self._split_why(state, batch)[:2]

    def _split_why(self, state: TrainState, batch: Any) -> tuple[Any, bool, tuple | None]:
        """:meth:`_split` and why ``auto`` chose the split and the head placement (None:
        nothing costed; :func:`jaxsmp.train.stage_costs.auto_partition`)."""
        partition, layers = self.options.pipeline_partition, _num_layers(state)
        costed = partition == "auto" or (self.options.pipeline_head == "auto" and
                                          self.options.pipeline == "interleaved")
        if not costed or state.mesh.pp == 1 or layers is None:
            return ("equal" if partition == "auto" else partition,
                    self.options.pipeline_head == "spread", None)
        rows = jax.tree.leaves(batch)[0].shape[0] // (state.mesh.data_size *
                                                      self.options.microbatches)
        micro = jax.tree.map(lambda x: jax.ShapeDtypeStruct((rows, *x.shape[1:]), x.dtype),
                             batch)
        chunks = _plan(state, self.options).chunks
        key = (jax.tree.structure(state), str(jax.tree.map(jnp.shape, (state.params, micro))))
        if key not in self._partitions:
            counts, spread, why = stage_costs.auto_partition(self.fn, state, self.options,
                                                             micro, layers, chunks)
            self._partitions[key] = ("equal" if len(set(counts)) == 1 else counts, spread, why)
        return self._partitions[key]

    def explain(self, state: TrainState, batch: Any) -> Explanation:
        """What this step runs on ``batch`` (arrays or shapes) and why: the attention
        kernel, context-parallel strategy, pipeline split, collectives, precision and
        remat, from a trace of the step itself (:mod:`jaxsmp.train.explain`)."""
        train = isinstance(self, TrainStep)  # eval splits batches only for the pipeline
        state, batch, plan = self._prepare(state, batch, self.options.microbatches
                                           if train else self._microbatches(state))
        body = self._gradients if train else self._eval
        return explain_step(self, state, batch, functools.partial(body, plan))

    def _with_fp8(self, state: TrainState) -> TrainState:
        """With ``precision="fp8"``: checked, and amax histories added if missing."""
        if not precision_policy(self.options.precision).fp8:
            return state
        fp8_state.check_fp8(state.mesh, self.options)
        return fp8_state.with_fp8(state, self.options.fp8_history, self.options.fp8_vocab)


class TrainStep(_Step):
    """A compiled training step: ``state, metrics = train_step(state, batch)``.

    ``state`` is donated: its buffers are reused for the new state.
    """

    def __init__(self, fn: LossFn, options: StepOptions):
        super().__init__(fn, options)
        self._compiled: dict = {}
        self._offloads_checked: set = set()  # (jit key, batch shapes) compiled and checked
        self._first_runs = FirstRuns()

    def _jitted(self, state: TrainState, plan: PipelinePlan, gradients_only: bool = False):
        key = (jax.tree.structure(state), plan, gradients_only)
        if key not in self._compiled:
            xla = self.options.compiler_options(state.mesh.jax_mesh.size)
            if gradients_only:
                shardings = state_shardings(state.params, state.mesh)
                self._compiled[key] = jax.jit(
                    functools.partial(self._gradient_metrics, plan), compiler_options=xla,
                    out_shardings=(shardings, None))
            else:
                self._compiled[key] = jax.jit(
                    functools.partial(self._step, plan), donate_argnums=0, out_shardings=(
                        state_shardings(state, state.mesh), None), compiler_options=xla)
        return self._compiled[key]

    def _gradients(self, plan: PipelinePlan, state: TrainState, batch: Any):
        """(float32 gradients of the mean loss, sharded like the parameters; loss; metrics)."""
        mesh = state.mesh
        forward = self._forward(state)
        dynamic = precision_policy(self.options.precision).loss_scaling
        scale = state.loss_scale.scale if dynamic else jnp.float32(1.0)

        def body(params: nnx.State, batch: Any, scale: jax.Array):
            params = manual.vary_over_replicas(params, mesh)
            gradients = (functools.partial(fp8_state.microbatch_gradients, plan)
                         if fp8_state.has_fp8(params) and plan.stages == 1
                         and plan.microbatches > 1 else plan.gradients)
            grads, loss, metrics = gradients(forward, params, batch, scale / mesh.data_size,
                                             branchless=mesh.tp > 1 or mesh.cp > 1)
            return (manual.sum_over_replicas(grads, mesh, self.options.reduce_jnp_dtype),
                    *manual.mean_over_data((loss, metrics), mesh))

        staged = plan.to_stages(state.params)
        specs = manual.param_specs(staged, mesh)
        grads, loss, metrics = manual.shard_map(
            body, mesh, in_specs=(specs, manual.batch_specs(batch, mesh), P()),
            out_specs=(specs, P(), P()))(staged, batch, scale)
        grads = plan.from_stages(grads, state.params)
        if dynamic:
            grads = jax.tree.map(lambda g: g / scale, grads)
        return grads, loss, metrics

    def _gradient_metrics(self, plan: PipelinePlan, state: TrainState, batch: Any):
        grads, loss, metrics = self._gradients(plan, state, batch)
        grad_norm = optax.tree.norm(fp8_state.trainable(grads))
        return grads, {"loss": loss, **metrics, "grad_norm": grad_norm}

    def _step(self, plan: PipelinePlan, state: TrainState, batch: Any):
        grads, loss, metrics = self._gradients(plan, state, batch)
        new_state, update_metrics = apply_gradients(state, grads, self.options)
        return new_state, {"loss": loss, **metrics, **update_metrics}

    def __call__(self, state: TrainState, batch: Any) -> tuple[TrainState, dict]:
        state, batch, plan = self._prepare(state, batch, self.options.microbatches)
        jitted = self._jitted(state, plan)
        if self.options.remat == "offload":
            self._check_offloads(jitted, plan, state, batch)
        self._first_runs.meet(jitted, plan, state, batch)
        return jitted(state, batch)

    def _check_offloads(self, jitted, plan: PipelinePlan, state: TrainState, batch: Any):
        """Once per compiled program: ``remat="offload"`` kept something in host memory
        (a backend that drops the offload fails here, before running)."""
        key = (jax.tree.structure(state), plan, str(jax.tree.map(jnp.shape, batch)))
        if key not in self._offloads_checked:
            check_offloads(jitted.lower(state, batch).compile().as_text())
            self._offloads_checked.add(key)

    def gradients(self, state: TrainState, batch: Any) -> tuple[nnx.State, dict]:
        """The step's gradients without updating anything: float32, sharded like the
        parameters, unscaled, before clipping; and the metrics ``loss``, ``grad_norm``
        and the loss function's own. ``state`` is not donated."""
        state, batch, plan = self._prepare(state, batch, self.options.microbatches)
        jitted = self._jitted(state, plan, gradients_only=True)
        self._first_runs.meet(jitted, plan, state, batch)
        return jitted(state, batch)

    def lower(self, state: TrainState, batch: Any, platforms: tuple[str, ...] | None = None):
        """The lowered step (for ``.compile().memory_analysis()`` and cost analysis).
        ``state`` and ``batch`` may be abstract (``jax.ShapeDtypeStruct``, e.g. from
        ``jaxsmp.checkpoint.abstract_state``); ``platforms`` lowers for other backends
        than this host's, e.g. ``("cuda",)``."""
        state, batch, plan = self._prepare(state, batch, self.options.microbatches)
        traced = self._jitted(state, plan).trace(state, batch)
        return traced.lower(lowering_platforms=platforms) if platforms else traced.lower()


class EvalStep(_Step):
    """A compiled evaluation step: ``metrics = eval_step(state, batch)`` (no update).
    With ``pp > 1`` the stages hold the layers as in training (``pipeline_partition``)
    and run GPipe's forward."""

    def __init__(self, fn: LossFn, options: StepOptions):
        super().__init__(fn, options)
        self._jits: dict = {}  # one jit per resolved plan
        self._first_runs = FirstRuns()

    def _eval(self, plan: PipelinePlan, state: TrainState, batch: Any) -> dict:
        mesh, forward = state.mesh, self._forward(state)
        staged = plan.to_stages(state.params)

        def body(params, batch):
            return manual.mean_over_data(plan.evaluate(forward, params, batch), mesh)

        loss, metrics = manual.shard_map(
            body, mesh, in_specs=(manual.param_specs(staged, mesh),
                                  manual.batch_specs(batch, mesh)),
            out_specs=(P(), P()))(staged, batch)
        return {"loss": loss, **metrics}

    def __call__(self, state: TrainState, batch: Any) -> dict:
        state, batch, plan = self._prepare(state, batch, self._microbatches(state))
        jitted = self._jitted(plan, state.mesh.jax_mesh.size)
        self._first_runs.meet(jitted, plan, state, batch)
        return jitted(state, batch)

    def lower(self, state: TrainState, batch: Any):
        """The lowered evaluation (``state`` and ``batch`` may be abstract), as calling
        the step compiles it: ``.compile()`` for its program and memory."""
        state, batch, plan = self._prepare(state, batch, self._microbatches(state))
        return self._jitted(plan, state.mesh.jax_mesh.size).trace(state, batch).lower()

    def _microbatches(self, state: TrainState) -> int:
        return self.options.microbatches if state.mesh.pp > 1 else 1

    def _jitted(self, plan: PipelinePlan, devices: int):
        if (plan, devices) not in self._jits:
            self._jits[plan, devices] = jax.jit(
                functools.partial(self._eval, plan),
                compiler_options=self.options.compiler_options(devices))
        return self._jits[plan, devices]


def step(fn: LossFn | None = None, **options: Any):
    """Decorator: ``@jaxsmp.step(microbatches=4, precision="bf16", remat="full")``
    turns ``loss_fn(model, batch) -> loss | (loss, metrics)`` into a :class:`TrainStep`."""
    if fn is None:
        return lambda f: TrainStep(f, StepOptions(**options))
    return TrainStep(fn, StepOptions(**options))


def eval_step(fn: LossFn | None = None, **options: Any):
    """Decorator like :func:`step` for evaluation: returns mean loss and metrics."""
    if fn is None:
        return lambda f: EvalStep(f, StepOptions(**options))
    return EvalStep(fn, StepOptions(**options))
