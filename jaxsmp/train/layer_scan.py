"""ZeRO-3 over a layer stack: one layer gathered at a time, the next one prefetched,
gathered weights freed after use, gradients reduce-scattered while the next layer runs.

The step installs :func:`zero3_scan` as the :class:`~jaxsmp.nn.LayerContext`'s layer
scan. Its forward and backward passes are written by hand (a custom VJP), because
autodiff of a scan keeps every input of the body for the backward pass, and the
gathered weights are such an input once they are prefetched through the carry:

* forward: ``W[i+1] = gather(shard[i+1])`` is issued in iteration ``i`` and travels in
  the scan carry, independent of layer ``i``'s compute; the iteration saves the
  residuals of layer ``i``'s VJP *except* its gathered weights (recognised by
  identity: a matmul's residual is its weight operand itself).
* backward: ``W[i]`` was re-gathered one iteration earlier (prefetch again), layer
  ``i``'s VJP runs on the saved residuals with ``W[i]`` put back, and layer ``i+1``'s
  full gradient, finished one iteration earlier, is reduce-scattered in float32 while
  layer ``i`` computes.

So with ``remat="none"`` the step keeps per layer only its activations, never its
gathered weights (FSDP's reshard-after-forward); the remat policies still apply to
what the VJP saves. Memory cost of prefetching: one more gathered layer in the forward,
one more gathered layer and one full float32 layer gradient in the backward.
``prefetch=False`` gathers and reduce-scatters in the iteration that needs them.

With ``active`` (a pipeline stage's padding slots, :mod:`jaxsmp.pipeline.layout`) only
the first ``active`` layers compute; the others pass their input on and get a zero
gradient; their gathers and reduce-scatters are skipped too (every device of an
``sdp`` group is on the same stage, so all take the same branch). With ``branchless``
(``tp > 1``: XLA:CPU deadlocks on GSPMD's tp collectives inside branches that stages
take differently) a padding slot gathers, computes the layer and discards it.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxsmp.nn.remat import remat
from jaxsmp.pipeline import vma

# apply(layer_params, h, args) -> h for one layer with its full (gathered) parameters
Apply = Callable[[Any, jax.Array, Sequence[Any]], jax.Array]


def _index(tree: Any, i) -> Any:
    return jax.tree.map(lambda x: x[i], tree)


def _float(x) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.floating)


class _Layer:
    """One layer's forward with its VJP residuals minus the gathered weights, and the
    backward from those residuals with the weights put back. Only float arguments
    get cotangents."""

    def __init__(self, apply: Apply, policy: str, args: Sequence[Any],
                 kept: Callable[[Any], list[bool]] = lambda w: []):
        self.apply, self.kept = remat(apply, policy), kept
        self.floating = [i for i, a in enumerate(args) if _float(a)]
        self.layout: dict = {}

    def float_args(self, args: Sequence[Any]) -> list:
        return [args[i] for i in self.floating]

    def forward(self, w, h, args: Sequence[Any]):
        """(output, residual leaves without ``w``'s)."""
        def with_float(w, h, fargs):
            merged = list(args)
            for i, a in zip(self.floating, fargs):
                merged[i] = a
            return self.apply(w, h, merged)
        out, pullback = jax.vjp(with_float, w, h, self.float_args(args))
        leaves, treedef = jax.tree.flatten(pullback)
        kept = self.kept(w)  # weights saved as they are, not gathered again
        weights = {id(x): k for k, x in enumerate(jax.tree.leaves(w))
                   if not (k < len(kept) and kept[k])}
        self.layout = {"treedef": treedef, "weights": [weights.get(id(x)) for x in leaves]}
        return out, [x for x in leaves if id(x) not in weights]

    def backward(self, w, residuals: list, cotangent):
        """(weight gradients, input cotangent, float-argument cotangents)."""
        weights, kept = jax.tree.leaves(w), iter(residuals)
        leaves = [next(kept) if k is None else weights[k] for k in self.layout["weights"]]
        return jax.tree.unflatten(self.layout["treedef"], leaves)(cotangent)

    def arg_cotangents(self, args: Sequence[Any], float_grads: list) -> list:
        out = [np.zeros(np.shape(a), jax.dtypes.float0) for a in args]
        for i, g in zip(self.floating, float_grads):
            out[i] = g
        return out


class _Skip(NamedTuple):
    """Which layers run: the first ``active`` (None: all); ``branchless``: by select."""
    active: jax.Array | None = None
    branchless: bool = False

    def __call__(self, i, run: Callable, identity: Callable):
        """``run()`` for layer ``i`` if it is active, else ``identity()`` (same shapes)."""
        if self.active is None:
            return run()
        if self.branchless:
            out, skipped = run(), identity()
            return jax.tree.map(lambda a, b: jnp.where(i < self.active, a, b), out, skipped)
        # both branches' outputs vary over the same manual axes (shard_map's types)
        axes = [a | b for a, b in zip(*(map(vma.varying, jax.make_jaxpr(f)().out_avals)
                                        for f in (run, identity)))]

        def typed(f):
            def branch():
                flat, tree = jax.tree.flatten(f())
                return jax.tree.unflatten(tree, [vma.vary(x, a) for x, a in zip(flat, axes)])
            return branch
        return jax.lax.cond(i < self.active, typed(run), typed(identity))

    def collective(self, i, run: Callable):
        """``run()`` (a gather or reduce-scatter of layer ``i``) if the layer is active,
        else zeros; always run when ``branchless`` (tp's devices must all reach it)."""
        if self.active is None or self.branchless:
            return run()
        return self(i, run, lambda: _zeros(jax.eval_shape(run)))


def _zeros(shapes: Any) -> Any:
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def _forward(layer: _Layer, gather: Callable, shards: Any, h: jax.Array, args: Sequence[Any],
             n: int, prefetch: bool, keep: bool, skip: _Skip = _Skip()):
    """(output, residuals stacked over the layers) of the layers in order. With
    ``prefetch`` the last iteration's prefetch is spare (one gather): peeling the last
    layer off the loop instead would copy every residual into one stack."""
    def run(w, h):
        return layer.forward(w, h, args) if keep else (layer.apply(w, h, args), [])

    def step(w, h, i):
        if skip.active is None:
            return run(w, h)
        res = jax.eval_shape(run, w, h)[1]
        return skip(i, lambda: run(w, h), lambda: (h, _zeros(res)))
    if not prefetch:
        def body(h, xs):
            shard, i = xs
            return step(skip.collective(i, lambda: gather(shard)), h, i)
        return jax.lax.scan(body, h, (shards, jnp.arange(n)))

    def body(carry, i):  # the next layer's gather does not wait for this layer
        h, w = carry
        w_next = skip.collective(  # the last iteration's is spare
            i + 1, lambda: gather(_index(shards, (i + 1) % n)))
        h, res = step(w, h, i)
        return (h, w_next), res

    # indices, not slices of the stacks: a slice would be copied whole before the loop
    (h, _), res = jax.lax.scan(body, (h, gather(_index(shards, 0))), jnp.arange(n))
    return h, res


def _layer_backward(layer: _Layer, skip: _Skip, i, w, r, dy, fargs: list):
    """Layer ``i``'s backward; a skipped layer's is the identity with zero gradients."""
    run = lambda: layer.backward(w, r, dy)
    if skip.active is None:
        return run()
    return skip(i, run, lambda: (_zeros(jax.eval_shape(lambda: w)), dy,
                                 [jnp.zeros_like(a) for a in fargs]))


def _backward(layer: _Layer, gather: Callable, scatter: Callable, shards: Any, res: Any,
              fargs: list, dy: jax.Array, n: int, prefetch: bool, skip: _Skip = _Skip()):
    """(stacked shard gradients, input cotangent, float-argument cotangents)."""
    zeros = [jnp.zeros_like(a) for a in fargs]
    add = lambda a, b: [x + y for x, y in zip(a, b)]
    back = lambda i, w, r, dy: _layer_backward(layer, skip, i, w, r, dy, fargs)
    if not prefetch:
        def body(carry, xs):
            dy, dargs = carry
            shard, r, i = xs
            dw, dy, da = back(i, skip.collective(i, lambda: gather(shard)), r, dy)
            return (dy, add(dargs, da)), skip.collective(i, lambda: scatter(dw, shard))
        (dy, dargs), grads = jax.lax.scan(body, (dy, zeros), (shards, res, jnp.arange(n)),
                                          reverse=True)
        return grads, dy, dargs
    return _pipelined_backward(back, lambda i, s: skip.collective(i, lambda: gather(s)),
                               lambda i, g, s: skip.collective(i, lambda: scatter(g, s)),
                               shards, res, dy, n, zeros, add)


def _pipelined_backward(back, gather, scatter, shards, res, dy, n, zeros, add):
    """Layer ``i``'s backward while ``W[i-1]`` is gathered and layer ``i+1``'s gradient
    reduce-scattered. The last layer runs before the scan (nothing to reduce-scatter
    yet), layer 0's reduce-scatter after it; the scan's layer 0 prefetches a spare
    gather, which keeps the loop branch-free. Residuals and shards are indexed, never
    sliced (XLA would copy a slice of a stack before the loop)."""
    w = gather(n - 1, _index(shards, n - 1))
    pending, dy, dargs = back(n - 1, w, _index(res, n - 1), dy)
    if n == 1:
        return jax.tree.map(lambda g: g[None], scatter(0, pending, _index(shards, 0))), dy, dargs
    w_prev = gather(n - 2, _index(shards, n - 2))

    def body(carry, i):  # layer i, for i = n-2 .. 0
        dy, dargs, w, pending = carry
        r = _index(res, i)
        below = jnp.maximum(i - 1, 0)
        w_below = gather(below, _index(shards, below))
        done = scatter(i + 1, pending, _index(shards, i + 1))  # layer i+1's, beside layer i
        dw, dy, da = back(i, w, r, dy)
        return (dy, add(dargs, da), w_below, dw), done

    (dy, dargs, _, pending), above = jax.lax.scan(
        body, (dy, dargs, w_prev, pending), jnp.arange(n - 1), reverse=True)
    first = scatter(0, pending, _index(shards, 0))
    grads = jax.tree.map(lambda g, rest: jnp.concatenate([g[None], rest]), first, above)
    return grads, dy, dargs


def zero3_scan(apply: Apply, h: jax.Array, shards: Any, args: Sequence[Any], *,
               gather: Callable[[Any], Any], scatter: Callable[[Any, Any], Any],
               remat: str = "none", prefetch: bool = True, active: jax.Array | None = None,
               branchless: bool = False,
               kept: Callable[[Any], list[bool]] = lambda w: []) -> jax.Array:
    """``apply`` over the stacked local layer shards ``shards`` (leading axis: layers):
    ``gather(shard)`` gives one layer's full parameters, ``scatter(grads, shard)`` their
    gradients reduced to the shard; only the first ``active`` layers compute (see the
    module docstring). ``kept(w)`` flags the leaves of a gathered layer the forward
    saves for the backward instead of the backward gathering them again (weights left
    split over sdp by activation gathering: no larger than their shards)."""
    layer = _Layer(apply, remat, args, kept)
    n = jax.tree.leaves(shards)[0].shape[0]

    @jax.custom_vjp  # ``active`` an argument: a custom VJP must not close over tracers
    def scan(shards, h, args, active):
        return _forward(layer, gather, shards, h, args, n, prefetch, keep=False,
                        skip=_Skip(active, branchless))[0]

    def forward(shards, h, args, active):
        out, res = _forward(layer, gather, shards, h, args, n, prefetch, keep=True,
                            skip=_Skip(active, branchless))
        return out, (shards, res, args, active)

    def backward(saved, dy):
        shards, res, args, active = saved
        grads, dh, dargs = _backward(layer, gather, scatter, shards, res,
                                     layer.float_args(args), dy, n, prefetch,
                                     _Skip(active, branchless))
        return grads, dh, layer.arg_cotangents(args, dargs), None

    scan.defvjp(forward, backward)
    return scan(shards, h, list(args), active)
