"""1F1B in fused lock-step ticks, for stages whose layers hold automatic collectives.

Under tensor parallelism GSPMD places ``tp``'s collectives inside the stage's layers,
and a collective inside a branch that some stages take and others do not hangs
(XLA:CPU); the table-driven ticks of :mod:`jaxsmp.pipeline.one_f_one_b` would have to
compute every op on every stage. Here every tick has one forward slot and one
backward slot: stage ``s`` runs the forward of microbatch ``t - s`` and the backward
of microbatch ``t - (2p - 2 - s)`` at tick ``t``. A slot runs on every device or on
none (it is skipped where no stage has work in it: the ramps); a stage with no work
in a running slot computes on placeholder data and discards it, as the GPipe
runner's off-schedule ticks do. The head runs between the slots: on the last stage,
where (its matmuls hold ``tp`` collectives too) every stage computes it and keeps the
last stage's, or spread (``pipeline_head="spread"``), each stage on its share.

``m + 2p - 2`` ticks, of which ``m + p - 1`` run each slot: in lock-step
``(m + p - 1)(F + B)``, GPipe's time, where computing every op at every tick took
twice that. A stage keeps the inputs of at most ``2(p - s) - 1`` microbatches (the
1F1B bound of ``p - s`` doubled, still independent of ``m``).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jaxsmp.pipeline.one_f_one_b import OneFOneB
from jaxsmp.pipeline.ticks import Buffers, Sums, choose, put


class FusedOneFOneB(OneFOneB):
    """:class:`~jaxsmp.pipeline.one_f_one_b.OneFOneB` with fused ticks (module
    docstring); the head, sums and final gradients are the table-driven class's."""

    @property
    def slots(self) -> int:
        """Microbatch inputs a stage keeps: stage 0's ``2p - 1``."""
        return 2 * self.p - 1

    def _run_ticks(self) -> tuple[Buffers, Sums]:
        z = jnp.zeros_like(self.xs[0])
        bufs, sums, _ = self._initial_carry()
        bufs = bufs._replace(inputs=jnp.zeros((self.slots, *z.shape), z.dtype))
        (bufs, sums, _), _ = lax.scan(self._fused_tick, self.vary((bufs, sums, (z, z))),
                                      jnp.arange(self.m + 2 * self.p - 2))
        return bufs, sums

    def _fused_tick(self, carry, t):
        bufs, sums, (received, cotangent) = carry
        p, m = self.p, self.m
        bufs, sums, out = lax.cond(t < m + p - 1, self._forward_slot,
                                   lambda b, s, t, x: self.vary((b, s, jnp.zeros_like(x))),
                                   bufs, sums, t, received)
        j = t - (p - 1)  # the microbatch whose forward the last stage just ran
        when = (j >= 0) & (j < m)
        if self.spread:
            bufs, sums = self._spread_head(bufs, sums, when, j, out)
        else:
            bufs, sums = lax.cond(when, self._last_head,
                                  lambda b, s, j, y: self.vary((b, s)), bufs, sums, j, out)
        bufs, sums, back = lax.cond(t >= p - 1, self._backward_slot,
                                    lambda b, s, t, g: self.vary((b, s, jnp.zeros_like(g))),
                                    bufs, sums, t, cotangent)
        ahead = [(i, i + 1) for i in range(p - 1)]
        behind = [(i + 1, i) for i in range(p - 1)]
        sent = (lax.ppermute(out, self.axis, ahead), lax.ppermute(back, self.axis, behind))
        return (bufs, sums, sent), None

    def _forward_slot(self, bufs: Buffers, sums: Sums, t, received):
        j = t - self.stage
        run = (j >= 0) & (j < self.m)
        j = jnp.clip(j, 0, self.m - 1)
        inp = jnp.where(self.stage == 0, self.xs[j], received)
        out = self._stage(self.layers, inp, j)
        bufs = bufs._replace(inputs=put(bufs.inputs, run, inp, j % self.slots))
        return self.vary((bufs, sums, out))

    def _last_head(self, bufs: Buffers, sums: Sums, j, y):
        last = self.stage == self.p - 1
        head = choose(last.astype(jnp.int32), [self._no_head, self._head], j, y,
                       branchless=self.branchless)
        return self.vary(self._take_head(bufs, sums, j, last, *head))

    def _backward_slot(self, bufs: Buffers, sums: Sums, t, received):
        j = t - (2 * self.p - 2 - self.stage)
        run = (j >= 0) & (j < self.m)
        j = jnp.clip(j, 0, self.m - 1)
        cotangent = jnp.where(self.stage == self.p - 1, bufs.cotangents[j % self.p], received)
        _, vjp = jax.vjp(lambda layers, h: self._stage(layers, h, j), self.layers,
                         bufs.inputs[j % self.slots])
        dlayers, dinp = self.vary(vjp(cotangent))
        bufs = bufs._replace(input_grads=put(bufs.input_grads, (self.stage == 0) & run,
                                              dinp, j))
        added = self.add_layers(sums.layers, dlayers)  # kept only where the slot had work
        sums = sums._replace(layers=jax.tree.map(lambda a, b: jnp.where(run, a, b), added,
                                                 sums.layers))
        return self.vary((bufs, sums, dinp))
