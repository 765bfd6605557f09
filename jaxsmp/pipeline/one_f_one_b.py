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

With ``spread_head`` the head does not run inside the last stage's ``F``: in that
tick the stage's output goes to every stage, each runs the head and loss on its
``1/p`` of the microbatch's examples, and the output cotangents are summed back to
the last stage. In lock-step (every tick as long as its slowest stage) a head heavier
than a stage's layers then costs ``1/p`` of its time (``pipeline_partition="auto"``
weighs both placements; :mod:`jaxsmp.pipeline.partition`).

Each stage keeps at most ``p`` microbatch inputs (the simulator's 1F1B peak is
``p - s``) instead of every microbatch's activations.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
from jaxsmp.pipeline.schedule import op_arrays
from jaxsmp.pipeline.stages import from_stage
from jaxsmp.pipeline.ticks import (
    Buffers,
    Messages,
    RecordStack,
    StackOutput,
    Sums,
    accumulator,
    choose,
    put,
)

# forward(params, batch, stack_hook) -> (loss, metrics): the user's loss with the hook
# installed as the stack's stage runner
Forward = Callable[[nnx.State, Any, Any], tuple[jax.Array, dict]]


def _tables(stages: int, microbatches: int) -> tuple[np.ndarray, np.ndarray]:
    """(kind, microbatch) per [tick, stage]: kind 0 idle, 1 forward, 2 backward."""
    kind, mb = op_arrays("interleaved", stages, microbatches)
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


def _match(grad: jax.Array, param: jax.Array) -> jax.Array:
    """``grad`` summed over the axes the buffers were made varying over but ``param``
    is not (the transpose of that cast; only size-1 axes can remain here, ``pp``
    having been reduced when broadcasting from the stages)."""
    extra = tuple(sorted(vma.varying(grad) - vma.varying(param)))
    return lax.psum(grad, extra) if extra else grad


class OneFOneB:
    """The 1F1B schedule of one step on this stage: recorded stack, tables, tick ops.
    ``OneFOneB(forward, params, batch, coef, ...).gradients(params)``: the gradients of
    ``coef * mean microbatch loss``, mean loss and mean metrics on this stage's
    parameters; ``forward(params, batch, hook)`` is the user's loss with ``hook``
    installed as the stack's stage runner. ``active``: layers each stage runs
    (``[stage][0]``) when stages are padded to equal slot counts. ``spread_head``: every
    stage runs the head on ``1/p`` of each microbatch's examples (module docstring),
    which ``p`` must divide. ``branchless``: :func:`~jaxsmp.pipeline.ticks.choose`'s."""

    def __init__(self, forward: Forward, params: nnx.State, batch: Any, coef: jax.Array, *,
                 stages: int, microbatches: int, axis: str, branchless: bool,
                 active: tuple[tuple[int, ...], ...] | None = None, spread_head: bool = False):
        self.forward, self.batch, self.coef, self.active = forward, batch, coef, active
        self.p, self.m, self.axis, self.branchless = stages, microbatches, axis, branchless
        self.spread = spread_head
        record = RecordStack()
        forward(params, batch, record)  # the layer function, the stack's structure, args
        self.run, stack_def = record.run, jax.tree.structure(record.params)
        self.mask = [is_stacked(v) for v in jax.tree.leaves(params, is_leaf=is_var)]
        self.maxima = [isinstance(v, Fp8Meta) for v in jax.tree.leaves(params, is_leaf=is_var)]
        self.add_top = accumulator(self.maxima)
        self.add_layers = accumulator([m for m, s in zip(self.maxima, self.mask) if s])
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
        if self.spread and self.xs.shape[1] % stages:
            raise ValueError(f"pipeline_head='spread' splits each microbatch's examples "
                             f"over the {stages} stages; a microbatch has {self.xs.shape[1]} "
                             f"per device; use pipeline_head='last' or a batch per device "
                             f"and microbatch that pp divides")
        self.kind, self.mb = (jnp.asarray(a) for a in _tables(stages, microbatches))
        # the metrics' structure (this forward is dead code for XLA)
        self.probe_metrics = forward(params, self._microbatch(0), StackOutput(self.xs[0]))[1]

    def _stack_input(self, params: nnx.State) -> jax.Array:
        record = RecordStack()
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

    def _head(self, j, y: jax.Array, mbatch: Any = None, share: int = 1):
        """(gradients through the head, output cotangent, loss, metrics) of microbatch j
        (or of ``mbatch``, ``1/share`` of one, whose loss weighs ``1/share``)."""
        mbatch = self._microbatch(j) if mbatch is None else mbatch

        def loss(params, y):
            value, metrics = self.forward(params, mbatch, StackOutput(y))
            return value * self.coef / share, (value, metrics)
        out, vjp, (value, metrics) = jax.vjp(loss, self.top, y, has_aux=True)
        dtop, dy = vjp(vma.vary(jnp.ones((), out.dtype), vma.varying(out)))
        return self.vary((dtop, dy, value, metrics))

    def _no_head(self, j, y: jax.Array):
        return self.vary((jax.tree.map(jnp.zeros_like, self.top), jnp.zeros_like(y),
                          jnp.zeros((), jnp.float32),
                          jax.tree.map(lambda v: jnp.zeros((), jnp.float32),
                                       self.probe_metrics)))

    def _forward_op(self, bufs: Buffers, sums: Sums, j):
        slot, last = j % self.p, self.stage == self.p - 1
        inp = jnp.where(self.stage == 0, self.xs[j], bufs.incoming[slot])
        out = self.vary(self._stage(self.layers, inp, j))
        bufs = bufs._replace(inputs=lax.dynamic_update_index_in_dim(bufs.inputs, inp, slot, 0))
        if not self.spread:  # the head runs here, on the last stage
            head = choose(last.astype(jnp.int32), [self._no_head, self._head], j, out,
                           branchless=self.branchless)
            bufs, sums = self._take_head(bufs, sums, j, last, *head)
        return bufs, sums, Messages(out, j + 1, jnp.zeros_like(out), jnp.int32(0))

    def _take_head(self, bufs: Buffers, sums: Sums, j, last, dtop, dy, value, metrics):
        """The head's output cotangent into the last stage's buffer; its sums added."""
        bufs = bufs._replace(cotangents=put(bufs.cotangents, last, dy, j % self.p))
        sums = sums._replace(top=self.add_top(sums.top, dtop), loss=sums.loss + value,
                             metrics=jax.tree.map(jnp.add, sums.metrics, metrics))
        return bufs, sums

    def _spread_head(self, bufs: Buffers, sums: Sums, when, j, out: jax.Array):
        """If ``when`` (the last stage ran ``F`` of microbatch ``j``; the same on every
        device): that microbatch's head, each stage on its share of the examples."""
        last = self.stage == self.p - 1

        def run(bufs, sums, out):
            y = from_stage(out, self.stage, self.p - 1, self.axis)
            k = y.shape[0] // self.p
            share = lambda a: lax.dynamic_slice_in_dim(a, self.stage * k, k, 0)
            dtop, dy, value, metrics = self._head(
                j, share(y), jax.tree.map(share, self._microbatch(j)), self.p)
            dy = lax.dynamic_update_slice_in_dim(jnp.zeros_like(y), dy, self.stage * k, 0)
            dy = lax.psum(dy.astype(jnp.float32), self.axis).astype(y.dtype)
            return self.vary(self._take_head(bufs, sums, j, last, dtop, dy, value, metrics))

        return lax.cond(when, run, lambda bufs, sums, out: self.vary((bufs, sums)),
                        bufs, sums, out)

    def _backward_op(self, bufs: Buffers, sums: Sums, j):
        slot = j % self.p
        _, vjp = jax.vjp(lambda layers, h: self._stage(layers, h, j), self.layers,
                         bufs.inputs[slot])
        dlayers, dinp = self.vary(vjp(bufs.cotangents[slot]))
        bufs = bufs._replace(input_grads=put(bufs.input_grads, self.stage == 0, dinp, j))
        sums = sums._replace(layers=self.add_layers(sums.layers, dlayers))
        return bufs, sums, Messages(jnp.zeros_like(dinp), jnp.int32(0), dinp, j + 1)

    def _idle_op(self, bufs: Buffers, sums: Sums, j):
        z = jnp.zeros_like(self.xs[0])
        return bufs, sums, Messages(z, jnp.int32(0), z, jnp.int32(0))

    def _tick(self, carry, t):
        bufs, sums, msg = carry
        bufs = bufs._replace(
            incoming=put(bufs.incoming, msg.forward_tag > 0, msg.forward,
                          (msg.forward_tag - 1) % self.p),
            cotangents=put(bufs.cotangents, msg.backward_tag > 0, msg.backward,
                            (msg.backward_tag - 1) % self.p))
        ops = [self._idle_op, self._forward_op, self._backward_op]
        bufs, sums, msg = choose(self.kind[t, self.stage],
                                  [lambda b, s, j, op=op: self.vary(op(b, s, j)) for op in ops],
                                  bufs, sums, self.mb[t, self.stage], branchless=self.branchless)
        if self.spread:
            bufs, sums = self._spread_head(bufs, sums, self.kind[t, self.p - 1] == 1,
                                           self.mb[t, self.p - 1], msg.forward)
        ahead = [(i, i + 1) for i in range(self.p - 1)]
        back = [(i + 1, i) for i in range(self.p - 1)]
        msg = Messages(*(lax.ppermute(x, self.axis, perm) for x, perm in
                          zip(msg, (ahead, ahead, back, back))))
        return (bufs, sums, msg), None

    def _initial_carry(self):
        buf = jnp.zeros((self.p, *self.xs.shape[1:]), self.xs.dtype)
        f32_zeros = lambda tree: jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), tree)
        bufs = Buffers(buf, buf, buf, jnp.zeros_like(self.xs))
        sums = Sums(f32_zeros(self.layers), f32_zeros(self.top), jnp.zeros((), jnp.float32),
                     jax.tree.map(lambda v: jnp.zeros((), jnp.float32), self.probe_metrics))
        z = jnp.zeros_like(self.xs[0])
        return self.vary((bufs, sums, Messages(z, jnp.int32(0), z, jnp.int32(0))))

    def _run_ticks(self) -> tuple[Buffers, Sums]:
        (bufs, sums, _), _ = lax.scan(self._tick, self._initial_carry(),
                                      jnp.arange(self.kind.shape[0]))
        return bufs, sums

    def gradients(self, params: nnx.State):
        bufs, sums = self._run_ticks()
        dxs = from_stage(bufs.input_grads, self.stage, 0, self.axis)
        (pre,) = self.pre_vjp(dxs.reshape(-1, *dxs.shape[2:]))
        top, loss, metrics = self._head_sums(sums)
        layers = iter(jax.tree.leaves(sums.layers))
        add = [jnp.maximum if m else jnp.add for m in self.maxima]
        out = [_match(a(g.astype(jnp.float32), next(layers) if s else t), x) for g, t, s, x, a
               in zip(jax.tree.leaves(pre), top, self.mask, jax.tree.leaves(params), add)]
        return (jax.tree.unflatten(jax.tree.structure(params), out), loss / self.m,
                jax.tree.map(lambda v: v / self.m, metrics))

    def _head_sums(self, sums: Sums):
        """(head gradient leaves, loss sum, metric sums) on every stage: the last
        stage's, or with the spread head all stages' shares combined (amax
        observations by maximum; each share's loss and metrics weigh ``1/p``)."""
        if not self.spread:
            top = jax.tree.leaves(from_stage(sums.top, self.stage, self.p - 1, self.axis))
            return (top, *from_stage((sums.loss, sums.metrics), self.stage, self.p - 1,
                                     self.axis))
        top = [(lax.pmax if m else lax.psum)(t, self.axis)
               for t, m in zip(jax.tree.leaves(sums.top), self.maxima)]
        loss, metrics = jax.tree.map(lambda v: lax.psum(v, self.axis) / self.p,
                                     (sums.loss, sums.metrics))
        return top, loss, metrics
