"""Executing the ``interleaved`` (1F1B) schedule: forward and backward by hand.

GPipe falls out of autodiff; 1F1B cannot, because the backward of microbatch ``j``
starts before the forward of microbatch ``j + p``. Here the step drives it:

1. *pre*: the user's loss function runs once with a stack hook that records the
   stack's input ``x`` (the embedding output), its per-microbatch arguments and the
   function that applies the local layers. ``jax.vjp`` of this pass gives the
   embedding's gradients at the end.
2. a scan over the ticks of :func:`~jaxsmp.pipeline.schedule.make_schedule` where
   each stage looks up its op: ``F`` runs its local layers on one microbatch and
   keeps the stage *input*; ``B`` recomputes the stage under ``jax.vjp`` (stage-level
   remat) and accumulates the layer gradients. On the last stage ``F`` is followed by
   *post*: the user's loss with the stack output given, whose ``jax.vjp`` gives the
   head's gradients and the output cotangent. Activations go forward and cotangents
   backward by ``lax.ppermute`` every tick, tagged with their microbatch.
3. the head/loss (last stage) and the stack-input cotangents (first stage) are
   broadcast over ``pp``, then the *pre* vjp runs.

Each stage keeps at most ``p`` microbatch inputs (the simulator's 1F1B peak is
``p - s``) instead of every microbatch's activations.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from jaxsmp.nn.fp8 import Fp8Meta
from jaxsmp.nn.param import is_var
from jaxsmp.nn.stack import is_stacked
from jaxsmp.pipeline import vma
from jaxsmp.pipeline.microbatch import pick, split_args, split_microbatches
from jaxsmp.pipeline.schedule import make_schedule
from jaxsmp.pipeline.stages import from_stage

# forward(params, batch, stack_hook) -> (loss, metrics): the user's loss with the hook
# installed as the stack's stage runner
Forward = Callable[[nnx.State, Any, Any], tuple[jax.Array, dict]]


class _RecordStack:
    """Stack hook recording the layer function, input, parameters and arguments."""

    def __call__(self, run, x, params, args):
        self.run, self.x, self.params, self.args = run, x, params, args
        return x


class _StackOutput:
    """Stack hook whose output is a given value (the input is unused)."""

    def __init__(self, y: jax.Array):
        self.y = y

    def __call__(self, run, x, params, args):
        return self.y


class _Buffers(NamedTuple):
    incoming: jax.Array   # [p, ...] activations received, by microbatch slot
    cotangents: jax.Array  # [p, ...] output cotangents received (or from the head)
    inputs: jax.Array     # [p, ...] stage inputs kept for the backward recompute
    input_grads: jax.Array  # [m, ...] cotangents of the stack input (stage 0)


class _Sums(NamedTuple):
    layers: Any   # gradients of the stage's stacked layers
    top: Any      # gradients of every parameter through the head (last stage)
    loss: jax.Array
    metrics: dict


class _Messages(NamedTuple):
    forward: jax.Array
    forward_tag: jax.Array   # microbatch + 1, 0: nothing sent
    backward: jax.Array
    backward_tag: jax.Array


def _tables(stages: int, microbatches: int) -> tuple[np.ndarray, np.ndarray]:
    """(kind, microbatch) per [tick, stage]: kind 0 idle, 1 forward, 2 backward."""
    schedule = make_schedule("interleaved", stages, microbatches)
    kind = np.zeros((schedule.ticks, stages), np.int32)
    mb = np.zeros((schedule.ticks, stages), np.int32)
    for s, row in enumerate(schedule.table):
        for t, op in enumerate(row):
            if op is not None:
                kind[t, s], mb[t, s] = (1 if op.kind == "F" else 2), op.microbatch
    _check_slots(kind, mb, stages)
    return kind, mb


def _check_slots(kind: np.ndarray, mb: np.ndarray, stages: int) -> None:
    """Buffers hold ``p`` microbatches (slot ``j % p``): no two live ones may share."""
    for s in range(stages):
        live: set[int] = set()
        for t in range(kind.shape[0]):
            if kind[t, s] == 1:
                live.add(int(mb[t, s]))
            elif kind[t, s] == 2:
                live.discard(int(mb[t, s]))
            if len({j % stages for j in live}) != len(live):
                raise AssertionError(f"1F1B buffer slots collide on stage {s} at tick {t}")


def _put(buf: jax.Array, when: jax.Array, value: jax.Array, slot: jax.Array) -> jax.Array:
    """``buf[slot] = value`` if ``when``, updating one slot in place."""
    return lax.dynamic_update_index_in_dim(buf, jnp.where(when, value, buf[slot]), slot, 0)


def _choose(index: jax.Array, branches: list[Callable], *args, branchless: bool):
    """``lax.switch``, or with ``branchless`` every branch computed and one selected
    (needed when GSPMD places collectives of automatic axes such as ``tp`` inside the
    branches: they span all devices, so every device must run them)."""
    if not branchless:
        return lax.switch(index, branches, *args)
    outs = [branch(*args) for branch in branches]
    return jax.tree.map(lambda *xs: lax.select_n(index, *xs), *outs)


def _accumulator(maxima: list[bool]) -> Callable:
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


def _match(grad: jax.Array, param: jax.Array) -> jax.Array:
    """``grad`` summed over the axes the buffers were made varying over but ``param``
    is not (the transpose of that cast; only size-1 axes can remain here, ``pp``
    having been reduced when broadcasting from the stages)."""
    extra = tuple(sorted(vma.varying(grad) - vma.varying(param)))
    return lax.psum(grad, extra) if extra else grad


class _OneFOneB:
    """The 1F1B schedule of one step on this stage: recorded stack, tables, tick ops."""

    def __init__(self, forward: Forward, params: nnx.State, batch: Any, coef: jax.Array, *,
                 stages: int, microbatches: int, axis: str, branchless: bool,
                 active: tuple[tuple[int, ...], ...] | None = None):
        self.forward, self.batch, self.coef, self.active = forward, batch, coef, active
        self.p, self.m, self.axis, self.branchless = stages, microbatches, axis, branchless
        record = _RecordStack()
        forward(params, batch, record)  # the layer function, the stack's structure, args
        self.run, stack_def = record.run, jax.tree.structure(record.params)
        self.mask = [is_stacked(v) for v in jax.tree.leaves(params, is_leaf=is_var)]
        self.maxima = [isinstance(v, Fp8Meta) for v in jax.tree.leaves(params, is_leaf=is_var)]
        self.add_top = _accumulator(self.maxima)
        self.add_layers = _accumulator([m for m, s in zip(self.maxima, self.mask) if s])
        leaves = jax.tree.leaves(params)
        stacked = [x for x, s in zip(leaves, self.mask) if s]
        if stack_def.num_leaves != len(stacked):
            raise NotImplementedError("the 'interleaved' (1F1B) pipeline needs the model's "
                                      "repeated layers in exactly one jaxsmp.nn.Stack")
        xs, self.pre_vjp = jax.vjp(self._stack_input, params)
        self.margs, self.per_example = split_args(record.args, xs.shape[0], microbatches)
        self.mbatches = split_microbatches(batch, microbatches)
        self.stage = lax.axis_index(axis)
        self.axes = frozenset({axis}).union(vma.varying(xs), *map(vma.varying, leaves))
        self.layers = jax.tree.unflatten(stack_def, stacked)
        self.top = self.vary(params)  # varying over pp: no implicit psum inside branches
        self.xs = self.vary(split_microbatches(xs, microbatches))
        self.kind, self.mb = (jnp.asarray(a) for a in _tables(stages, microbatches))
        # the metrics' structure (this forward is dead code for XLA)
        self.probe_metrics = forward(params, self._microbatch(0), _StackOutput(self.xs[0]))[1]

    def _stack_input(self, params: nnx.State) -> jax.Array:
        record = _RecordStack()
        self.forward(params, self.batch, record)
        return record.x

    def vary(self, tree: Any) -> Any:
        return jax.tree.map(lambda x: vma.vary(x, self.axes), tree)

    def _microbatch(self, j) -> Any:
        return jax.tree.map(lambda a: a[j], self.mbatches)

    def _stage(self, layers: Any, h: jax.Array, j) -> jax.Array:
        """This stage's layers on microbatch ``j`` (only its first ``active`` slots)."""
        args = pick(self.margs, self.per_example, j)
        if self.active is None:
            return self.run(h, layers, args)
        return self.run(h, layers, args, jnp.asarray(self.active, jnp.int32)[self.stage, 0])

    def _head(self, j, y: jax.Array):
        """(gradients through the head, output cotangent, loss, metrics) of microbatch j."""
        def loss(params, y):
            value, metrics = self.forward(params, self._microbatch(j), _StackOutput(y))
            return value * self.coef, (value, metrics)
        out, vjp, (value, metrics) = jax.vjp(loss, self.top, y, has_aux=True)
        dtop, dy = vjp(vma.vary(jnp.ones((), out.dtype), vma.varying(out)))
        return self.vary((dtop, dy, value, metrics))

    def _no_head(self, j, y: jax.Array):
        return self.vary((jax.tree.map(jnp.zeros_like, self.top), jnp.zeros_like(y),
                          jnp.zeros((), jnp.float32),
                          jax.tree.map(lambda v: jnp.zeros((), jnp.float32),
                                       self.probe_metrics)))

    def _forward_op(self, bufs: _Buffers, sums: _Sums, j):
        slot, last = j % self.p, self.stage == self.p - 1
        inp = jnp.where(self.stage == 0, self.xs[j], bufs.incoming[slot])
        out = self.vary(self._stage(self.layers, inp, j))
        dtop, dy, value, metrics = _choose(last.astype(jnp.int32), [self._no_head, self._head],
                                           j, out, branchless=self.branchless)
        bufs = bufs._replace(inputs=lax.dynamic_update_index_in_dim(bufs.inputs, inp, slot, 0),
                             cotangents=_put(bufs.cotangents, last, dy, slot))
        sums = sums._replace(top=self.add_top(sums.top, dtop), loss=sums.loss + value,
                             metrics=jax.tree.map(jnp.add, sums.metrics, metrics))
        return bufs, sums, _Messages(out, j + 1, jnp.zeros_like(out), jnp.int32(0))

    def _backward_op(self, bufs: _Buffers, sums: _Sums, j):
        slot = j % self.p
        _, vjp = jax.vjp(lambda layers, h: self._stage(layers, h, j), self.layers,
                         bufs.inputs[slot])
        dlayers, dinp = self.vary(vjp(bufs.cotangents[slot]))
        bufs = bufs._replace(input_grads=_put(bufs.input_grads, self.stage == 0, dinp, j))
        sums = sums._replace(layers=self.add_layers(sums.layers, dlayers))
        return bufs, sums, _Messages(jnp.zeros_like(dinp), jnp.int32(0), dinp, j + 1)

    def _idle_op(self, bufs: _Buffers, sums: _Sums, j):
        z = jnp.zeros_like(self.xs[0])
        return bufs, sums, _Messages(z, jnp.int32(0), z, jnp.int32(0))

    def _tick(self, carry, t):
        bufs, sums, msg = carry
        bufs = bufs._replace(
            incoming=_put(bufs.incoming, msg.forward_tag > 0, msg.forward,
                          (msg.forward_tag - 1) % self.p),
            cotangents=_put(bufs.cotangents, msg.backward_tag > 0, msg.backward,
                            (msg.backward_tag - 1) % self.p))
        ops = [self._idle_op, self._forward_op, self._backward_op]
        bufs, sums, msg = _choose(self.kind[t, self.stage],
                                  [lambda b, s, j, op=op: self.vary(op(b, s, j)) for op in ops],
                                  bufs, sums, self.mb[t, self.stage], branchless=self.branchless)
        ahead = [(i, i + 1) for i in range(self.p - 1)]
        back = [(i + 1, i) for i in range(self.p - 1)]
        msg = _Messages(*(lax.ppermute(x, self.axis, perm) for x, perm in
                          zip(msg, (ahead, ahead, back, back))))
        return (bufs, sums, msg), None

    def _initial_carry(self):
        buf = jnp.zeros((self.p, *self.xs.shape[1:]), self.xs.dtype)
        f32_zeros = lambda tree: jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), tree)  # noqa: E731
        bufs = _Buffers(buf, buf, buf, jnp.zeros_like(self.xs))
        sums = _Sums(f32_zeros(self.layers), f32_zeros(self.top), jnp.zeros((), jnp.float32),
                     jax.tree.map(lambda v: jnp.zeros((), jnp.float32), self.probe_metrics))
        z = jnp.zeros_like(self.xs[0])
        return self.vary((bufs, sums, _Messages(z, jnp.int32(0), z, jnp.int32(0))))

    def gradients(self, params: nnx.State):
        (bufs, sums, _), _ = lax.scan(self._tick, self._initial_carry(),
                                      jnp.arange(self.kind.shape[0]))
        dxs = from_stage(bufs.input_grads, self.stage, 0, self.axis)
        (pre,) = self.pre_vjp(dxs.reshape(-1, *dxs.shape[2:]))
        top = jax.tree.leaves(from_stage(sums.top, self.stage, self.p - 1, self.axis))
        layers = iter(jax.tree.leaves(sums.layers))
        add = [jnp.maximum if m else jnp.add for m in self.maxima]
        out = [_match(a(g.astype(jnp.float32), next(layers) if s else t), x) for g, t, s, x, a
               in zip(jax.tree.leaves(pre), top, self.mask, jax.tree.leaves(params), add)]
        loss, metrics = from_stage((sums.loss, sums.metrics), self.stage, self.p - 1, self.axis)
        return (jax.tree.unflatten(jax.tree.structure(params), out), loss / self.m,
                jax.tree.map(lambda v: v / self.m, metrics))


def gradients(forward: Forward, params: nnx.State, batch: Any, coef: jax.Array, *,
              stages: int, microbatches: int, axis: str = "pp", branchless: bool = False,
              active: tuple[tuple[int, ...], ...] | None = None):
    """(gradients of ``coef * mean microbatch loss``, mean loss, mean metrics) on this
    stage's parameters, running the 1F1B schedule. ``forward(params, batch, hook)``
    is the user's loss with ``hook`` installed as the stack's stage runner. With
    ``branchless`` (tensor parallelism) every stage computes forward, backward and
    head each tick and keeps the one its table names. ``active``: layers each stage
    runs (``[stage][0]``) when stages are padded to equal slot counts."""
    return _OneFOneB(forward, params, batch, coef, stages=stages, microbatches=microbatches,
                     axis=axis, branchless=branchless, active=active).gradients(params)
