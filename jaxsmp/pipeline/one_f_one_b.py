"""Executing the ``interleaved`` (1F1B) schedule: forward and backward by hand.

GPipe falls out of autodiff; 1F1B cannot, because the backward of microbatch ``j``
starts before the forward of microbatch ``j + p``. Here the step drives it:

1. *pre*: the user's loss function runs once with a capturing pipeline hook, which
   records the stack's input ``x`` (the embedding output), its per-microbatch
   arguments and the function that applies the local layers. ``jax.vjp`` of this
   pass gives the embedding's gradients at the end.
2. a scan over the ticks of :func:`~jaxsmp.pipeline.schedule.make_schedule` where
   each stage looks up its op: ``F`` runs its local layers on one microbatch and
   keeps the stage *input*; ``B`` recomputes the stage under ``jax.vjp`` (stage-level
   remat) and accumulates the layer gradients. On the last stage ``F`` is followed by
   *post*: the user's loss with the stack output injected, whose ``jax.vjp`` gives
   the head's gradients and the output cotangent. Activations go forward and
   cotangents backward by ``lax.ppermute`` every tick, tagged with their microbatch.
3. masked ``psum`` over ``pp`` of the head/loss (last stage) and the stack-input
   cotangents (first stage), then the *pre* vjp.

Each stage keeps at most ``p`` microbatch inputs (the simulator's 1F1B peak is
``p - s``) instead of every microbatch's activations.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from jaxsmp.pipeline.schedule import make_schedule
from jaxsmp.pipeline import vma
from jaxsmp.train.batch import split_microbatches
from jaxsmp.train.param_gather import is_stacked

Forward = Callable[[nnx.State, Any, Any], tuple[jax.Array, dict]]


class _Capture:
    """Pipeline hook recording the stack's layer function, input, parameters, args."""

    def __call__(self, run, x, params, args):
        self.run, self.x, self.params, self.args = run, x, params, args
        return x


class _Inject:
    """Pipeline hook whose stack output is a given value (the input is unused)."""

    def __init__(self, y: jax.Array):
        self.y = y

    def __call__(self, run, x, params, args):
        return self.y


def _is_var(x) -> bool:
    return isinstance(x, nnx.Variable)


def _stacked_mask(params: nnx.State) -> list[bool]:
    return [is_stacked(v) for v in jax.tree.leaves(params, is_leaf=_is_var)]


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


def gradients(forward: Forward, params: nnx.State, batch: Any, coef: jax.Array, *,
              stages: int, microbatches: int, axis: str = "pp", branchless: bool = False):
    """(gradients of ``coef * mean microbatch loss``, mean loss, mean metrics) on this
    stage's parameters, running the 1F1B schedule. ``forward(params, batch, hook)``
    is the user's loss with ``hook`` installed as the stack's pipeline. With
    ``branchless`` (tensor parallelism) every stage computes forward, backward and
    head each tick and keeps the one its table names."""
    p, m = stages, microbatches
    cap = _Capture()
    forward(params, batch, cap)  # the layer function, the stack's structure and args
    b = cap.x.shape[0]
    mask = _stacked_mask(params)
    leaves = jax.tree.leaves(params)
    stack_def = jax.tree.structure(cap.params)
    stacked = [x for x, s in zip(leaves, mask) if s]
    if stack_def.num_leaves != len(stacked):
        raise NotImplementedError(
            "the 'interleaved' (1F1B) pipeline needs the model's repeated layers in exactly "
            "one jaxsmp.nn.Stack")
    sp = jax.tree.unflatten(stack_def, stacked)

    def pre(p_):
        hook = _Capture()
        forward(p_, batch, hook)
        return hook.x

    xs, pre_vjp = jax.vjp(pre, params)
    split = [np.ndim(a) >= 1 and np.shape(a)[0] == b for a in cap.args]
    margs = [a.reshape(m, b // m, *a.shape[1:]) if s else a for a, s in zip(cap.args, split)]
    mbatches = split_microbatches(batch, m)
    stage = lax.axis_index(axis)
    axes = frozenset({axis}).union(vma.varying(xs), *(vma.varying(x) for x in leaves))
    vary = lambda tree: jax.tree.map(lambda x: vma.vary(x, axes), tree)  # noqa: E731
    top = vary(params)  # varying over pp: no implicit psum inside per-stage branches
    xs = vary(xs.reshape(m, b // m, *xs.shape[1:]))
    kind_table, mb_table = (jnp.asarray(a) for a in _tables(p, m))

    def stage_fn(sp_, h, j):
        return cap.run(h, sp_, [a[j] if s else a for a, s in zip(margs, split)])

    # the metrics' structure (this forward is dead code for XLA)
    _, probe_metrics = forward(params, jax.tree.map(lambda a: a[0], mbatches), _Inject(xs[0]))

    def post_grads(j, y):
        mbatch = jax.tree.map(lambda a: a[j], mbatches)

        def loss(p_, y_):
            value, metrics = forward(p_, mbatch, _Inject(y_))
            return value * coef, (value, metrics)
        out, vjp, (value, metrics) = jax.vjp(loss, top, y, has_aux=True)
        dtop, dy = vjp(vma.vary(jnp.ones((), out.dtype), vma.varying(out)))
        return vary((dtop, dy, value, metrics))

    def zeros_post(j, y):
        dtop = jax.tree.map(jnp.zeros_like, top)
        return vary((dtop, jnp.zeros_like(y), jnp.zeros((), jnp.float32),
                     jax.tree.map(lambda v: jnp.zeros((), jnp.float32), probe_metrics)))

    def forward_op(c, j):
        slot = j % p
        inp = jnp.where(stage == 0, xs[j], c["in_buf"][slot])
        out = vary(stage_fn(sp, inp, j))
        dtop, dy, value, metrics = _choose((stage == p - 1).astype(jnp.int32),
                                           [zeros_post, post_grads], j, out,
                                           branchless=branchless)
        c = dict(c, inp_buf=lax.dynamic_update_index_in_dim(c["inp_buf"], inp, slot, 0),
                 acc_top=jax.tree.map(jnp.add, c["acc_top"], dtop),
                 loss=c["loss"] + value,
                 metrics=jax.tree.map(jnp.add, c["metrics"], metrics))
        c["g_buf"] = _put(c["g_buf"], stage == p - 1, dy, slot)
        return c, out, j + 1, jnp.zeros_like(out), jnp.int32(0)

    def backward_op(c, j):
        slot = j % p
        _, vjp = jax.vjp(lambda s_, h: stage_fn(s_, h, j), sp, c["inp_buf"][slot])
        dsp, dinp = vary(vjp(c["g_buf"][slot]))
        c = dict(c, acc_sp=jax.tree.map(jnp.add, c["acc_sp"], dsp))
        c["dxs"] = _put(c["dxs"], stage == 0, dinp, j)
        return c, jnp.zeros_like(dinp), jnp.int32(0), dinp, j + 1

    def idle_op(c, j):
        z = vary(jnp.zeros_like(xs[0]))
        return c, z, jnp.int32(0), z, jnp.int32(0)

    def tick(carry, t):
        c, msg_f, tag_f, msg_b, tag_b = carry
        c = dict(c)
        c["in_buf"] = _put(c["in_buf"], tag_f > 0, msg_f, (tag_f - 1) % p)
        c["g_buf"] = _put(c["g_buf"], tag_b > 0, msg_b, (tag_b - 1) % p)
        kind, j = kind_table[t, stage], mb_table[t, stage]
        c, send_f, tf, send_b, tb = _choose(
            kind, [lambda c_, j_: vary(idle_op(c_, j_)), lambda c_, j_: vary(forward_op(c_, j_)),
                   lambda c_, j_: vary(backward_op(c_, j_))], c, j, branchless=branchless)
        fwd = [(i, i + 1) for i in range(p - 1)]
        bwd = [(i + 1, i) for i in range(p - 1)]
        return (c, lax.ppermute(send_f, axis, fwd), lax.ppermute(tf, axis, fwd),
                lax.ppermute(send_b, axis, bwd), lax.ppermute(tb, axis, bwd)), None

    buf = jnp.zeros((p, *xs.shape[1:]), xs.dtype)
    init = vary(dict(
        in_buf=buf, g_buf=buf, inp_buf=buf, dxs=jnp.zeros_like(xs),
        acc_sp=jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), sp),
        acc_top=jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), top),
        loss=jnp.zeros((), jnp.float32),
        metrics=jax.tree.map(lambda v: jnp.zeros((), jnp.float32), probe_metrics)))
    z = vary(jnp.zeros_like(xs[0]))
    carry = (init, z, vary(jnp.int32(0)), z, vary(jnp.int32(0)))
    (c, *_), _ = lax.scan(tick, carry, jnp.arange(kind_table.shape[0]))
    return _combine(c, params, pre_vjp, mask, stage, p, m, axis)


def _match(grad: jax.Array, param: jax.Array) -> jax.Array:
    """``grad`` summed over the axes the buffers were made varying over but ``param``
    is not (the transpose of that cast; only size-1 axes such as ``sdp=1`` remain here,
    ``pp`` having been reduced by the masked psums)."""
    extra = tuple(sorted(vma.varying(grad) - vma.varying(param)))
    return lax.psum(grad, extra) if extra else grad


def _combine(c: dict, params: nnx.State, pre_vjp, mask: list[bool], stage, p: int, m: int,
             axis: str):
    """Masked psums over ``pp`` and the embedding backward; grads shaped like ``params``."""
    def from_stage(tree, src):  # float32: XLA:CPU aborts on bf16 all-reduces
        def one(x):
            masked = jnp.where(stage == src, x, jnp.zeros_like(x)).astype(jnp.float32)
            return lax.psum(masked, axis).astype(x.dtype)
        return jax.tree.map(one, tree)
    dxs = from_stage(c["dxs"], 0)
    (pre_grads,) = pre_vjp(dxs.reshape(-1, *dxs.shape[2:]).astype(dxs.dtype))
    top = jax.tree.leaves(from_stage(c["acc_top"], p - 1))
    layers = iter(jax.tree.leaves(c["acc_sp"]))
    pre = jax.tree.leaves(pre_grads)
    out = [_match(g.astype(jnp.float32) + (next(layers) if s else t), x)
           for g, t, s, x in zip(pre, top, mask, jax.tree.leaves(params))]
    grads = jax.tree.unflatten(jax.tree.structure(params), out)
    loss = from_stage(c["loss"], p - 1) / m
    metrics = jax.tree.map(lambda v: v / m, from_stage(c["metrics"], p - 1))
    return grads, loss, metrics
