"""``pipeline_partition="auto"``: the stage split from the model's compiled costs.

The user's loss is cut where the :class:`~jaxsmp.nn.Stack` sits (as the 1F1B schedule
cuts it): one stacked layer and the head (everything after it, the loss included). Each piece's forward and backward is compiled
on one device (the host's CPU for GPU targets, :func:`_forward`) for one microbatch of
this device's rows, and XLA's cost analysis gives its FLOPs and bytes; a
roofline on the target's peak rate and memory bandwidth turns them into time, and
:func:`jaxsmp.pipeline.timing.one_f_one_b_split` splits the layers and places the
head (``pipeline_head="auto"``).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxsmp.mesh import Mesh
from jaxsmp.nn.param import is_var
from jaxsmp.pipeline.layout import equal_counts
from jaxsmp.pipeline.partition import balanced_counts, roofline_seconds
from jaxsmp.pipeline.ticks import RecordStack, StackOutput
from jaxsmp.pipeline.timing import one_f_one_b_split
from jaxsmp.train.forward import LossFn, local_forward
from jaxsmp.train.options import StepOptions

# (peak FLOP/s, bytes/s) of the roofline per platform: an H100 SXM's dense bf16 and HBM3
# for GPUs; for CPUs a ratio typical of one core's FMA rate over its memory bandwidth
RATES = {"gpu": (989e12, 3.35e12), "cuda": (989e12, 3.35e12), "cpu": (1e11, 1e10)}


def _abstract(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), tree)


def _whole(params: Any) -> Any:
    """Abstract parameters as one device holds them: no mesh axes, nothing to gather."""
    def whole(v):
        value = jax.ShapeDtypeStruct(v.shape, v.dtype)
        if "mesh_axes" not in v.get_metadata():
            return v.replace(value)
        return v.replace(value, mesh_axes=(None,) * len(v.shape))
    return jax.tree.map(whole, params, is_leaf=is_var)


def _seconds(fn, *args, rates, device) -> float:
    """Roofline seconds of ``fn`` compiled for ``device`` (abstract arguments)."""
    place = jax.sharding.SingleDeviceSharding(device)
    args = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=place), args)
    compiled = jax.jit(fn).lower(*args).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return roofline_seconds(float(cost.get("flops", 0.0)),
                            float(cost.get("bytes accessed", 0.0)), *rates)


def _forward(fn: LossFn, state, options: StepOptions):
    """The step's forward on one device (no collectives). A CPU step's own device; for
    GPUs the host's CPU (a deviceless GPU compile has no cost analysis) with the
    reference attention, whose FLOPs XLA counts (a kernel's would not compile there)."""
    device, impl = state.mesh.jax_mesh.devices.flat[0], None
    if device.platform != "cpu":
        device, impl = jax.devices("cpu")[0], "reference"
    one = Mesh(devices=[device])
    simple = dataclasses.replace(options, sequence_parallel=False, context_parallel="auto",
                                 pipeline="simple", pipeline_partition="equal",
                                 pipeline_head="auto")
    return one, local_forward(fn, state.graphdef, simple, "auto", one.jax_mesh, impl)


def piece_seconds(fn: LossFn, state, options: StepOptions, microbatch: Any,
                  platform: str) -> tuple[float, float, float]:
    """(one layer's forward, one layer's forward + backward, head and loss forward +
    backward) seconds on one microbatch (abstract arrays: nothing runs). The embedding
    runs on every stage outside the ticks in every schedule, so it is not costed."""
    rates = RATES.get(platform, RATES["cpu"])
    one, forward = _forward(fn, state, options)
    params, batch = _whole(state.params), _abstract(microbatch)
    with jax.set_mesh(one.jax_mesh):
        record = RecordStack()
        jax.eval_shape(lambda p, b: forward(p, b, record), params, batch)
        x = jax.ShapeDtypeStruct(record.x.shape, record.x.dtype)

        def layer(p, b, w, h):  # the layer's arguments (e.g. positions) traced afresh
            rec = RecordStack()
            forward(p, b, rec)
            return jax.grad(lambda w, h: rec.run(h, w, rec.args).astype(jnp.float32).sum(),
                            argnums=(0, 1))(w, h)

        def layer_forward(p, b, w, h):
            rec = RecordStack()
            forward(p, b, rec)
            return rec.run(h, w, rec.args)

        def head(p, b, y):
            return jax.grad(lambda p, y: forward(p, b, StackOutput(y))[0],
                            argnums=(0, 1))(p, y)
        first = jax.tree.map(lambda a: jax.ShapeDtypeStruct((1, *a.shape[1:]), _real(a.dtype)),
                             _abstract(record.params))
        cost = functools.partial(_seconds, rates=rates, device=one.jax_mesh.devices.flat[0])
        return (cost(layer_forward, params, batch, first, x),
                cost(layer, params, batch, first, x), cost(head, params, batch, x))


def _real(dtype):
    """float32 for the fp8 histories' max-accumulating dtype (costed as float32)."""
    return dtype if jnp.issubdtype(dtype, jnp.number) else jnp.float32


def auto_partition(fn: LossFn, state, options: StepOptions, microbatch: Any,
                   num_layers: int, chunks: int) -> tuple[tuple[int, ...], bool, tuple]:
    """(layers per virtual stage, whether 1F1B spreads the head over the stages, why each)
    balancing the stage times the schedule runs; ``auto`` options are chosen, the
    others kept. The head is part of 1F1B's last stage (it runs inside its forward
    ticks) or spread over all stages after them: the split and placement are the
    fastest in the lock-step simulation of the ticks. The other schedules run the
    embedding and the head on every stage outside the ticks (the most even split)."""
    partition, head = options.pipeline_partition, options.pipeline_head
    given = (None if partition == "auto" else equal_counts(num_layers, state.mesh.pp, chunks)
             if partition == "equal" else tuple(partition))
    if options.pipeline != "interleaved":  # identical layers, nothing else in the ticks
        return (given or balanced_counts([1.0] * num_layers, state.mesh.pp * chunks), False,
                (f"{options.pipeline} runs identical layers and nothing else in its ticks: "
                 f"the most even split", None))
    platform = state.mesh.jax_mesh.devices.flat[0].platform
    forward, both, head_seconds = piece_seconds(fn, state, options, microbatch, platform)
    args = (num_layers, state.mesh.pp, options.microbatches, forward, both, head_seconds)
    fused = state.mesh.tp > 1  # as the step runs it (jaxsmp.pipeline.fused_ticks)
    rows = jax.tree.leaves(microbatch)[0].shape[0]
    split = one_f_one_b_split(*args, can_spread=rows % state.mesh.pp == 0, counts=given,
                              fused=fused, placement=head)
    ms = lambda t: f"{t * 1e3:.3g} ms"
    split_why = (f"1F1B's ticks simulated on compiled costs ({platform} roofline: a layer "
                 f"{ms(forward)} forward, {ms(both)} forward and backward, the head "
                 f"{ms(head_seconds)}){', fused under tp' if fused else ''}: the fastest split, "
                 f"{ms(split.seconds)} per step")
    head_why = ("spreading it is at least 2% faster in the same simulation" if split.spread_head
                else f"{rows} rows per microbatch do not divide by pp={state.mesh.pp}"
                if rows % state.mesh.pp else "spreading it is not 2% faster in the same simulation")
    return split.counts, split.spread_head, (split_why, head_why)
