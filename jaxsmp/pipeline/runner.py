"""SPMD pipeline execution of a :class:`~jaxsmp.nn.Stack` inside the step's ``shard_map``.

Every ``pp`` rank holds its stage's layers (the stacked ``layers`` axis is split over
``pp``). The runner scans over ticks; at each tick every stage runs its local layers
(one chunk of them for ``virtual``) on one microbatch and hands the result to the
next stage with ``lax.ppermute``. Stage 0 reads fresh microbatches (and, for
``virtual``, the microbatches coming round from the last stage); the last stage's
outputs are the stack's output, broadcast to every stage by a masked ``psum``.
Autodiff of the tick scan runs the backward in mirror order through the transposed
ppermutes: the ``simple`` (GPipe) and ``virtual`` (circular GPipe) schedules of
:mod:`jaxsmp.pipeline.schedule`. Off-schedule ticks compute on placeholder data
whose results never reach the output (SPMD: every rank runs the same program).

Per-microbatch arguments of the stack (``layer(x, *args)``) are those whose leading
dimension equals ``x``'s batch; they are split like ``x``. Others are passed whole.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxsmp.pipeline.schedule import check_microbatches
from jaxsmp.pipeline.vma import vary, varying

RunLayers = Callable[[jax.Array, Any, Sequence[Any]], jax.Array]
EXECUTABLE = ("simple", "virtual")


def virtual_layer_order(num_layers: int, stages: int, chunks: int) -> np.ndarray:
    """Stored-layer permutation giving stage ``s`` the chunks ``s, s+p, s+2p, ...``
    (contiguous over ``pp`` after permuting)."""
    if num_layers % (stages * chunks):
        raise ValueError(
            f"the virtual pipeline needs the {num_layers} stacked layers divisible into "
            f"pp x chunks = {stages} x {chunks} = {stages * chunks} equal chunks")
    n = num_layers // (stages * chunks)
    chunk_ids = [c * stages + s for s in range(stages) for c in range(chunks)]
    return np.concatenate([np.arange(i * n, (i + 1) * n) for i in chunk_ids])


@dataclass(frozen=True)
class Pipeline:
    """``pipeline(run, x, params, args)``: ``run(h, layer_params, args)`` applies the
    given local layers; the result is the whole stack's output on every stage."""
    schedule: str
    stages: int
    microbatches: int
    chunks: int = 1
    axis: str = "pp"

    def __post_init__(self) -> None:
        check_microbatches(self.schedule, self.stages, self.microbatches)
        if self.schedule not in EXECUTABLE:
            raise ValueError(
                f"Pipeline runs the autodiff schedules {EXECUTABLE}; {self.schedule!r} (1F1B) "
                "is driven by jaxsmp.pipeline.one_f_one_b.gradients (the step does this)")
        if self.schedule == "simple" and self.chunks != 1:
            raise ValueError(f"'simple' has one chunk per stage; got chunks={self.chunks}")

    @property
    def ticks(self) -> int:
        return self.microbatches * self.chunks + self.stages - 1

    def _split_args(self, args: Sequence[Any], batch: int) -> tuple[list, list[bool]]:
        m = self.microbatches
        split = [np.ndim(a) >= 1 and np.shape(a)[0] == batch for a in args]
        out = [a.reshape(m, batch // m, *a.shape[1:]) if s else a for a, s in zip(args, split)]
        return out, split

    def _chunk(self, params: Any, chunk: jax.Array) -> Any:
        if self.chunks == 1:
            return params
        local = jax.tree.leaves(params)[0].shape[0]
        if local % self.chunks:
            raise ValueError(f"{local} local layers do not split into {self.chunks} chunks")
        n = local // self.chunks
        return jax.tree.map(lambda a: lax.dynamic_slice_in_dim(a, chunk * n, n, 0), params)

    def __call__(self, run: RunLayers, x: jax.Array, params: Any,
                 args: Sequence[Any]) -> jax.Array:
        p, m, v = self.stages, self.microbatches, self.chunks
        b = x.shape[0]
        if b % m:
            raise ValueError(f"local batch {b} is not divisible by microbatches={m}")
        stage = lax.axis_index(self.axis)
        axes = frozenset({self.axis}).union(
            varying(x), *(varying(a) for a in jax.tree.leaves((params, args))))
        # cast in float32: its transpose is a psum over pp (bf16 all-reduces abort XLA:CPU)
        xs = vary(x.astype(jnp.float32).reshape(m, b // m, *x.shape[1:]), axes).astype(x.dtype)
        margs, split = self._split_args(args, b)
        perm = [(i, (i + 1) % p) for i in range(p if v > 1 else p - 1)]

        def tick(carry, t):
            state, ring = carry
            if v > 1 and m == p:  # what comes round from the last stage is due now
                fresh = jnp.where(t < m, xs[jnp.minimum(t, m - 1)], state)
            elif v > 1:  # stage 0 keeps what comes round from the last stage for later
                slot = jnp.mod(t - p, m)  # in place: one slot, not the whole ring
                ring = lax.dynamic_update_index_in_dim(
                    ring, jnp.where(t >= p, state, ring[slot]), slot, 0)
                fresh = jnp.where(t < m, xs[jnp.minimum(t, m - 1)], ring[jnp.mod(t, m)])
            else:
                fresh = xs[jnp.minimum(t, m - 1)]
            item = jnp.clip(t - stage, 0, m * v - 1)
            mb = jnp.mod(item, m)
            inp = jnp.where(stage == 0, fresh, state)
            local_args = [a[mb] if s else a for a, s in zip(margs, split)]
            out = vary(run(inp, self._chunk(params, item // m), local_args), axes)
            return (lax.ppermute(out, self.axis, perm), ring), out

        zeros = vary(jnp.zeros_like(xs[0]), axes)
        ring = vary(jnp.zeros_like(xs), axes) if v > 1 and m > p else jnp.zeros((0,), x.dtype)
        _, outs = lax.scan(tick, (zeros, ring), jnp.arange(self.ticks))
        last = outs[(v - 1) * m + p - 1:]
        # float32: XLA:CPU aborts on bf16 all-reduces (jax 0.10.2)
        masked = jnp.where(stage == p - 1, last, jnp.zeros_like(last)).astype(jnp.float32)
        return lax.psum(masked, self.axis).astype(x.dtype).reshape(x.shape)
