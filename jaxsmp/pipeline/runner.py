"""SPMD pipeline execution of a :class:`~jaxsmp.nn.Stack` inside the step's ``shard_map``.

Every ``pp`` rank holds its stage's layers (the stacked ``layers`` axis is split over
``pp``). The runner scans over ticks; at each tick every stage runs its local layers
(one chunk of them for ``virtual``) on one microbatch and hands the result to the
next stage with ``lax.ppermute``. Stage 0 reads fresh microbatches and, for
``virtual``, the microbatches coming round from the last stage: ``p`` at a time when
``p`` divides ``m``, so each is due the tick it arrives; otherwise stage 0 delays them
``m - p`` ticks in a shift register. The last stage's outputs are the stack's output,
broadcast to every stage by a masked ``psum``. A ``virtual`` chunk's weights are
taken again in the backward (:mod:`jaxsmp.pipeline.chunk`), not kept once per tick.
Autodiff of the tick scan runs the backward in mirror order through the transposed
ppermutes: the ``simple`` (GPipe) and ``virtual`` (circular GPipe) schedules of
:mod:`jaxsmp.pipeline.schedule`. Off-schedule ticks compute on placeholder data
whose results never reach the output (SPMD: every rank runs the same program).

With an unequal :class:`~jaxsmp.pipeline.layout.StageLayout` each chunk runs only its
first ``active`` layer slots (``run(h, params, args, active)``); the rest are padding.

Per-microbatch arguments of the stack (``layer(x, *args)``) are those whose leading
dimension equals ``x``'s batch; they are split like ``x``. Others are passed whole.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxsmp.pipeline.chunk import run_chunk
from jaxsmp.pipeline.microbatch import pick, split_args, split_microbatches
from jaxsmp.pipeline.schedule import item, virtual_group
from jaxsmp.pipeline.stages import from_stage
from jaxsmp.pipeline.vma import vary, varying

# run(h, layer_params, args, active=None): the local layers (the first ``active`` slots)
RunLayers = Callable[..., jax.Array]


@dataclass(frozen=True)
class StageRunner:
    """``runner(run, x, params, args)``: ``run(h, layer_params, args)`` applies the
    given local layers; the result is the whole stack's output on every stage. The
    autodiff schedules only (``simple``, ``virtual``); validated by the plan.
    ``active``: ``[stages, chunks]`` layers each chunk runs (None: all its slots)."""
    stages: int
    microbatches: int
    chunks: int = 1
    axis: str = "pp"
    active: tuple[tuple[int, ...], ...] | None = None

    @property
    def ticks(self) -> int:
        return self.microbatches * self.chunks + self.stages - 1

    @property
    def group(self) -> int:
        return virtual_group(self.stages, self.microbatches, self.chunks)

    def item(self, k):
        """(chunk, microbatch) of the ``k``-th item every stage runs."""
        return item(k, self.group, self.chunks)

    def _last_chunk_ticks(self) -> np.ndarray:
        """The ticks at which the last stage finishes each microbatch, in order."""
        k = np.arange(self.microbatches * self.chunks)
        chunk, microbatch = self.item(k)
        return (k[chunk == self.chunks - 1][np.argsort(microbatch[chunk == self.chunks - 1])]
                + self.stages - 1)

    def _active(self, stage: jax.Array, chunk: jax.Array) -> tuple:
        """``run``'s ``active`` argument: none when every slot runs."""
        if self.active is None:
            return ()
        return (jnp.asarray(self.active, jnp.int32)[stage, chunk],)

    def _fresh(self, xs, t, state, ring):
        """(stage 0's input at tick ``t``, the updated delay line ``ring`` of the
        microbatches that came back from the last stage before they are due)."""
        p, size = self.stages, self.group
        chunk, microbatch = self.item(jnp.minimum(t, self.microbatches * self.chunks - 1))
        fresh = jax.tree.map(lambda a: a[microbatch], xs)
        if self.chunks == 1:
            return fresh, ring
        back = state
        if size > p:  # it came round ``size - p`` ticks early: a shift register
            back = jax.tree.map(lambda r: r[0], ring)
            ring = jax.tree.map(lambda r, s: jnp.concatenate([r[1:], s[None]]), ring, state)
        return jax.tree.map(lambda f, b: jnp.where(chunk == 0, f, b), fresh, back), ring

    def _microbatches(self, x: Any, axes: frozenset) -> Any:
        """The stack input split into microbatches: the hidden state by rows; with a
        carry ``(hidden, statistics)`` the statistics go with microbatch 0, zeros with
        the others (their sum over the microbatches is the stack's)."""
        m = self.microbatches
        h, stats = (x, None) if isinstance(x, jax.Array) else x
        # cast in float32: its transpose is a psum over pp (bf16 all-reduces abort XLA:CPU)
        hs = vary(split_microbatches(h.astype(jnp.float32), m), axes).astype(h.dtype)
        if stats is None:
            return hs
        first = jax.tree.map(lambda s: jnp.concatenate(
            [s[None], jnp.zeros((m - 1, *jnp.shape(s)), s.dtype)]), stats)
        return hs, jax.tree.map(lambda s: vary(s, axes), first)

    def __call__(self, run: RunLayers, x: Any, params: Any, args: Sequence[Any]) -> Any:
        """The stack's output for its input ``x``: the hidden state, or a carry
        ``(hidden, statistics)`` whose statistics each layer adds to (a mixture of
        experts' router statistics): they travel with their microbatch and are summed
        over the microbatches."""
        p, m, v = self.stages, self.microbatches, self.chunks
        b = jax.tree.leaves(x)[0].shape[0]
        if b % m:
            raise ValueError(f"local batch {b} is not divisible by microbatches={m}")
        stage = lax.axis_index(self.axis)
        axes = frozenset({self.axis}).union(
            *(varying(a) for a in jax.tree.leaves((x, params, args))))
        xs = self._microbatches(x, axes)
        margs, per_example = split_args(args, b, m)
        perm = [(i, (i + 1) % p) for i in range(p if v > 1 else p - 1)]
        size = jax.tree.leaves(params)[0].shape[0] // v

        def tick(carry, t):
            state, ring = carry
            fresh, ring = self._fresh(xs, t, state, ring)
            chunk, microbatch = self.item(jnp.clip(t - stage, 0, m * v - 1))
            inp = jax.tree.map(lambda f, s: jnp.where(stage == 0, f, s), fresh, state)
            margs_t = pick(margs, per_example, microbatch)
            active = self._active(stage, chunk)
            out = (run(inp, params, margs_t, *active) if v == 1 else
                   run_chunk(run, params, chunk, size, inp, margs_t, active))
            out = jax.tree.map(lambda o: vary(o, axes), out)
            return (lax.ppermute(out, self.axis, perm), ring), out

        zeros = jax.tree.map(lambda a: vary(jnp.zeros_like(a[0]), axes), xs)
        ring = (jax.tree.map(lambda a: vary(jnp.zeros_like(a[:self.group - p]), axes), xs)
                if self.group > p and v > 1 else jnp.zeros((0,), jnp.float32))
        _, outs = lax.scan(tick, (zeros, ring), jnp.arange(self.ticks))
        ticks = self._last_chunk_ticks()
        contiguous = np.array_equal(ticks, np.arange(ticks[0], ticks[0] + m))
        last = from_stage(jax.tree.map(lambda o: o[ticks[0]:] if contiguous else o[ticks],
                                       outs), stage, p - 1, self.axis)
        if isinstance(x, jax.Array):
            return last.reshape(x.shape)
        return last[0].reshape(x[0].shape), jax.tree.map(lambda s: s.sum(0), last[1])
