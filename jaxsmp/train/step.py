"""``@jaxsmp.step``: a user loss function becomes a compiled, sharded training step.

Forward and backward run inside one ``jax.shard_map`` that is manual over the data
axes (``dp``, ``sdp``) and automatic over ``tp`` (GSPMD places the Megatron splits).
Top-level parameters are gathered over ``sdp`` once per microbatch; stacked layers
are gathered one at a time inside the layer scan (ZeRO-3). The gradient of every
gather is the matching reduce-scatter; after the microbatch scan the accumulated
shards are summed over ``dp`` (hybrid sharding's second hop). The optimizer then
updates the sharded float32 master parameters outside the ``shard_map``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

import collectives
from flax import nnx
from jax.sharding import PartitionSpec as P

from jaxsmp.nn.layer_context import LayerContext, layer_context
from jaxsmp.nn.remat import POLICIES
from jaxsmp.pipeline import one_f_one_b
from jaxsmp.pipeline.layout import inverse, permute_stacked
from jaxsmp.pipeline.runner import Pipeline, virtual_layer_order
from jaxsmp.pipeline.schedule import SCHEDULES, check_microbatches
from jaxsmp.sharding.rules import batch_spec
from jaxsmp.train.batch import place_batch, split_microbatches
from jaxsmp.train.embed_lookup import is_lookup_table, lookup_hook
from jaxsmp.train.param_gather import (MANUAL_AXES, PIPELINE_AXIS, gather_tree, is_stacked,
                                       manual_spec, mesh_axes, sdp_dim)
from jaxsmp.train.precision import precision_policy
from jaxsmp.train.state import TrainState, state_shardings

LossFn = Callable[[nnx.Module, Any], jax.Array | tuple[jax.Array, dict]]


@dataclass(frozen=True)
class StepOptions:
    """``microbatches``: gradient-accumulation steps per global batch. ``precision``:
    ``fp32``, ``bf16`` or ``fp16`` (dynamic loss scaling). ``remat``: ``none``,
    ``full``, ``save_matmuls`` or ``offload``. ``clip_norm``: global-norm clipping
    (``None`` disables). ``collectives``: the sdp gather algorithm (default: the
    mesh's). ``bucket``: gather each layer's parameters with one collective over
    one flat buffer instead of one per parameter. ``pipeline`` (when the mesh has
    pp > 1): ``simple`` (GPipe), ``virtual`` (``virtual_chunks`` chunks of layers per
    stage) or ``interleaved`` (1F1B, driven by hand); then ``microbatches`` is
    the pipeline's microbatch count (see :mod:`jaxsmp.pipeline`)."""
    microbatches: int = 1
    precision: str = "fp32"
    remat: str = "none"
    clip_norm: float | None = 1.0
    collectives: str | None = None
    bucket: bool = True
    pipeline: str = "simple"
    virtual_chunks: int = 2

    def __post_init__(self) -> None:
        if self.pipeline not in SCHEDULES:
            raise ValueError(f"unknown pipeline schedule {self.pipeline!r}; valid: {SCHEDULES}")
        if not isinstance(self.virtual_chunks, int) or self.virtual_chunks < 1:
            raise ValueError(f"virtual_chunks must be a positive integer, "
                             f"got {self.virtual_chunks!r}")
        if not isinstance(self.microbatches, int) or self.microbatches < 1:
            raise ValueError(f"microbatches must be a positive integer, got {self.microbatches!r}")
        precision_policy(self.precision)
        if self.remat not in POLICIES:
            raise ValueError(f"unknown remat policy {self.remat!r}; valid: {POLICIES}")


def _is_var(x) -> bool:
    return isinstance(x, nnx.Variable)


def _param_specs(params: nnx.State) -> Any:
    return jax.tree.map(lambda v: manual_spec(mesh_axes(v)), params, is_leaf=_is_var)


def _batch_specs(batch: Any) -> Any:
    return jax.tree.map(lambda x: batch_spec(x.ndim), batch)


def _pipeline(mesh, options: StepOptions) -> Pipeline | None:
    """The autodiff pipeline runner for ``pp`` > 1 (None for pp=1 and for 1F1B, which
    :func:`_one_f_one_b_body` drives itself)."""
    if mesh.pp == 1:
        return None
    if options.pipeline == "interleaved":
        check_microbatches(options.pipeline, mesh.pp, options.microbatches)
        return None
    chunks = options.virtual_chunks if options.pipeline == "virtual" else 1
    return Pipeline(options.pipeline, mesh.pp, options.microbatches, chunks)


def _manual_axes(mesh) -> set[str]:
    return set(MANUAL_AXES) | ({PIPELINE_AXIS} if mesh.pp > 1 else set())


def _layer_order(state: TrainState, pipeline: Pipeline | None):
    """The stacked-layer permutation of the virtual schedule (None: stored order)."""
    if pipeline is None or pipeline.chunks == 1:
        return None
    stacked = [v for v in jax.tree.leaves(state.params, is_leaf=_is_var) if is_stacked(v)]
    return virtual_layer_order(stacked[0].shape[0], pipeline.stages, pipeline.chunks)


def _forward(fn: LossFn, graphdef: nnx.GraphDef, params: nnx.State, batch: Any,
             options: StepOptions, algorithm: str,
             pipeline: Pipeline | None = None) -> tuple[jax.Array, dict]:
    """The user's loss on local parameter shards, gathering them over sdp as needed."""
    dtype = precision_policy(options.precision).compute_dtype
    # Embed tables sharded on their columns are looked up from their shards (no
    # table gather); their gathered values stay available to other readers, one
    # gather each, which XLA drops when unused (see jaxsmp.train.embed_lookup)
    tables = {id(v) for v in jax.tree.leaves(params, is_leaf=_is_var)
              if not is_stacked(v) and is_lookup_table(v, sdp_dim)}
    top = gather_tree(params, dtype, algorithm,
                      select=lambda v: not is_stacked(v) and id(v) not in tables,
                      bucket=options.bucket)
    top = gather_tree(top, dtype, algorithm, select=lambda v: id(v) in tables)
    ctx = LayerContext(gather=lambda s: gather_tree(s, dtype, algorithm, bucket=options.bucket),
                       remat=options.remat, pipeline=pipeline,
                       embed_lookup=lookup_hook(params, top, tables, dtype))
    with layer_context(ctx):
        out = fn(nnx.merge(graphdef, top), batch)
    loss, metrics = out if isinstance(out, tuple) else (out, {})
    return loss.astype(jnp.float32), {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}


def _replica_axes(var: nnx.Variable) -> tuple[str, ...]:
    """The data axes a parameter is replicated over: always dp, and sdp unless the
    parameter is split over it (e.g. sdp=1)."""
    return ("dp",) if sdp_dim(var) is not None else ("dp", "sdp")


def _vary_over_replicas(params: nnx.State) -> nnx.State:
    """Marks float32 parameters as differing per replica, so that their gradients stay
    local (summed once, in float32, by :func:`_sum_over_replicas`) rather than being
    summed implicitly where they are used in the compute dtype."""
    return jax.tree.map(lambda v: v.replace(jax.lax.pcast(v[...], _replica_axes(v),
                                                          to="varying")),
                        params, is_leaf=_is_var)


def _sum_over_replicas(grads: nnx.State) -> nnx.State:
    return jax.tree.map(lambda g: g.replace(jax.lax.psum(g[...], _replica_axes(g))),
                        grads, is_leaf=_is_var)


def _local_gradients(fn: LossFn, state: TrainState, options: StepOptions, algorithm: str):
    """The shard_map body: microbatch scan of forward + backward on local shards.
    With pp > 1 the microbatches are the pipeline's: one forward + backward of the
    whole local batch, split by the pipeline runner inside the layer stack."""
    if state.mesh.pp > 1 and options.pipeline == "interleaved":
        return _one_f_one_b_body(fn, state, options, algorithm)
    pipeline = _pipeline(state.mesh, options)
    m = 1 if pipeline else options.microbatches
    norm = m * state.mesh.data_size

    def body(params: nnx.State, batch: Any, scale: jax.Array):
        params = _vary_over_replicas(params)  # one sum over replicas after the scan

        def micro(acc, mbatch):
            def scaled_loss(p):
                loss, metrics = _forward(fn, state.graphdef, p, mbatch, options, algorithm,
                                         pipeline)
                return loss * scale / norm, (loss, metrics)
            grads, aux = jax.grad(scaled_loss, has_aux=True)(params)
            acc = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), acc, grads)
            return acc, aux

        zeros = jax.tree.map(lambda x: jnp.zeros_like(x, jnp.float32), params)
        acc, (losses, metrics) = jax.lax.scan(micro, zeros, split_microbatches(batch, m))
        grads = _sum_over_replicas(acc)
        mean = lambda x: jax.lax.pmean(x.mean(), MANUAL_AXES)  # noqa: E731
        return grads, mean(losses), jax.tree.map(mean, metrics)
    return body


def _one_f_one_b_body(fn: LossFn, state: TrainState, options: StepOptions, algorithm: str):
    """The shard_map body for the ``interleaved`` (1F1B) schedule."""
    m = options.microbatches
    norm = m * state.mesh.data_size

    def body(params: nnx.State, batch: Any, scale: jax.Array):
        params = _vary_over_replicas(params)  # one sum over replicas at the end

        def forward(p, b, hook):
            return _forward(fn, state.graphdef, p, b, options, algorithm, hook)
        grads, loss, metrics = one_f_one_b.gradients(forward, params, batch, scale / norm,
                                                     stages=state.mesh.pp, microbatches=m,
                                                     branchless=state.mesh.tp > 1)
        grads = _sum_over_replicas(grads)
        mean = lambda x: jax.lax.pmean(x, MANUAL_AXES)  # noqa: E731
        return grads, mean(loss), jax.tree.map(mean, metrics)
    return body


def _learning_rate(opt_state: Any) -> jax.Array | None:
    """The learning rate of an ``optax.inject_hyperparams`` optimizer (possibly chained)."""
    hyperparams = getattr(opt_state, "hyperparams", None)
    if isinstance(hyperparams, dict) and "learning_rate" in hyperparams:
        return hyperparams["learning_rate"]
    if isinstance(opt_state, tuple):
        for inner in opt_state:
            lr = _learning_rate(inner)
            if lr is not None:
                return lr
    return None


def _apply(state: TrainState, grads: nnx.State, options: StepOptions):
    dynamic = precision_policy(options.precision).loss_scaling
    if dynamic:
        grads = jax.tree.map(lambda g: g / state.loss_scale.scale, grads)
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(grad_norm)
    if options.clip_norm is not None:
        factor = jnp.minimum(1.0, options.clip_norm / (grad_norm + 1e-6))
        grads = jax.tree.map(lambda g: g * factor, grads)
    updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    loss_scale = state.loss_scale
    if dynamic:  # an overflowing step leaves parameters and optimizer state untouched
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)  # noqa: E731
        params, opt_state = keep(params, state.params), keep(opt_state, state.opt_state)
        loss_scale = loss_scale.update(finite)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                              loss_scale=loss_scale)
    metrics = {"grad_norm": grad_norm, "skipped": (~finite).astype(jnp.int32)}
    if dynamic:
        metrics["loss_scale"] = loss_scale.scale
    lr = _learning_rate(opt_state)
    if lr is not None:
        metrics["learning_rate"] = jnp.asarray(lr, jnp.float32)
    return new_state, metrics


def _check_mesh(state: TrainState, options: StepOptions) -> None:
    """Fails early for pipeline settings the runner cannot execute."""
    _layer_order(state, _pipeline(state.mesh, options))


class TrainStep:
    """A compiled training step: ``state, metrics = train_step(state, batch)``.

    ``state`` is donated: its buffers are reused for the new state.
    """

    def __init__(self, fn: LossFn, options: StepOptions):
        self.fn, self.options = fn, options
        functools.update_wrapper(self, fn)
        self._compiled: dict = {}

    def _jitted(self, state: TrainState):
        key = jax.tree.structure(state)
        if key not in self._compiled:
            shardings = state_shardings(state, state.mesh)
            self._compiled[key] = jax.jit(self._step, donate_argnums=0,
                                          out_shardings=(shardings, None))
        return self._compiled[key]

    def _step(self, state: TrainState, batch: Any):
        algorithm = self.options.collectives or state.mesh.collectives
        body = _local_gradients(self.fn, state, self.options, algorithm)
        specs = _param_specs(state.params)
        dynamic = precision_policy(self.options.precision).loss_scaling
        scale = state.loss_scale.scale if dynamic else jnp.float32(1.0)
        order = _layer_order(state, _pipeline(state.mesh, self.options))
        params = state.params if order is None else permute_stacked(state.params, state.params,
                                                                     order)
        with collectives.scope(mesh=state.mesh.jax_mesh):  # host and MPI groups of sdp
            grads, loss, metrics = jax.shard_map(
                body, mesh=state.mesh.jax_mesh, axis_names=_manual_axes(state.mesh),
                in_specs=(specs, _batch_specs(batch), P()), out_specs=(specs, P(), P()),
            )(params, batch, scale)
        if order is not None:
            grads = permute_stacked(grads, state.params, inverse(order))
        new_state, update_metrics = _apply(state, grads, self.options)
        return new_state, {"loss": loss, **metrics, **update_metrics}

    def __call__(self, state: TrainState, batch: Any) -> tuple[TrainState, dict]:
        _check_mesh(state, self.options)
        batch = place_batch(batch, state.mesh, self.options.microbatches)
        return self._jitted(state)(state, batch)

    def lower(self, state: TrainState, batch: Any):
        """The lowered step (for ``.compile().memory_analysis()`` and cost analysis)."""
        batch = place_batch(batch, state.mesh, self.options.microbatches)
        return self._jitted(state).lower(state, batch)


class EvalStep:
    """A compiled evaluation step: ``metrics = eval_step(state, batch)`` (no update)."""

    def __init__(self, fn: LossFn, options: StepOptions):
        self.fn, self.options = fn, options
        functools.update_wrapper(self, fn)
        self._jit = jax.jit(self._eval)

    def _eval(self, state: TrainState, batch: Any) -> dict:
        algorithm = self.options.collectives or state.mesh.collectives

        # forward only: the stored (contiguous) layer order runs the GPipe schedule
        pipeline = None if state.mesh.pp == 1 else Pipeline("simple", state.mesh.pp,
                                                            self.options.microbatches)

        def body(params, batch):
            loss, metrics = _forward(self.fn, state.graphdef, params, batch, self.options,
                                     algorithm, pipeline)
            mean = lambda x: jax.lax.pmean(x, MANUAL_AXES)  # noqa: E731
            return mean(loss), jax.tree.map(mean, metrics)

        with collectives.scope(mesh=state.mesh.jax_mesh):
            loss, metrics = jax.shard_map(
                body, mesh=state.mesh.jax_mesh, axis_names=_manual_axes(state.mesh),
                in_specs=(_param_specs(state.params), _batch_specs(batch)), out_specs=(P(), P()),
            )(state.params, batch)
        return {"loss": loss, **metrics}

    def __call__(self, state: TrainState, batch: Any) -> dict:
        microbatches = self.options.microbatches if state.mesh.pp > 1 else 1
        return self._jit(state, place_batch(batch, state.mesh, microbatches))


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
