"""Lock-step timing models of the pipeline schedules, from per-layer times: how long
1F1B's ticks take with given layers per stage and head placement, and the split and
placement that minimise it. ``pipeline_partition="auto"``
(:mod:`jaxsmp.train.stage_costs`) and the planner (:mod:`jaxsmp.plan.throughput`) use
them; :func:`jaxsmp.pipeline.simulator.lockstep_time` is their tick-by-tick reference.

In lock-step every tick lasts as long as its slowest op, as in jaxsmp's SPMD runner
where all stages step together.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from jaxsmp.pipeline.partition import balanced_counts
from jaxsmp.pipeline.schedule import op_arrays


@dataclass(frozen=True)
class OneFOneBSplit:
    """Layers per 1F1B stage, and whether the head is spread over the stages."""
    counts: tuple[int, ...]
    spread_head: bool
    seconds: float


def one_f_one_b_split(num_layers: int, stages: int, microbatches: int, layer_forward: float,
                      layer_backward: float, head: float, *, can_spread: bool,
                      counts: Sequence[int] | None = None, fused: bool = False,
                      placement: str = "auto", tolerance: float = 0.02) -> OneFOneBSplit:
    """The faster of the head on the last stage and the head spread over the stages
    (``can_spread``: the microbatch's examples divide by ``stages``), each with its
    fastest split (:func:`one_f_one_b_counts`; with ``fused`` ticks, the most even)
    or with the given ``counts``; the last stage keeps the head unless spreading it
    is ``tolerance`` faster. ``placement``: ``"last"`` or ``"spread"`` fixes it."""
    def best(spread: bool) -> OneFOneBSplit:
        if counts is not None:
            split = tuple(counts)
        elif fused:  # the head runs between the slots, outside every stage's ops
            split = balanced_counts([1.0] * num_layers, stages)
        else:
            split = one_f_one_b_counts(num_layers, stages, microbatches, layer_forward,
                                       layer_backward, head, tolerance, spread_head=spread)
        timing = fused_seconds if fused else one_f_one_b_seconds
        return OneFOneBSplit(split, spread, timing(
            split, microbatches, layer_forward, layer_backward, head, spread_head=spread))
    if placement != "auto":
        return best(placement == "spread")
    last = best(False)
    if not can_spread:
        return last
    spread = best(True)
    return spread if spread.seconds * (1 + tolerance) < last.seconds else last


def one_f_one_b_counts(num_layers: int, stages: int, microbatches: int, layer_forward: float,
                       layer_backward: float, head: float,
                       tolerance: float = 0.02, spread_head: bool = False) -> tuple[int, ...]:
    """Layers per stage of the 1F1B schedule run in lock-step (every tick as long as its
    slowest op): a stage's forward is its layers' forward (the last stage's also the
    head's forward and backward, unless ``spread_head``), its backward its layers'
    recompute and backward. Local search from the equal and the load-balanced splits,
    each move one layer between neighbours; the equal split stays unless another is
    ``tolerance`` faster."""
    def seconds(counts):
        return one_f_one_b_seconds(counts, microbatches, layer_forward, layer_backward, head,
                                   spread_head=spread_head)
    starts = [balanced_counts([layer_forward + layer_backward] * num_layers, stages,
                              last=0.0 if spread_head else head)]
    best = min((_descend(list(c), seconds) for c in starts), key=seconds)
    if num_layers % stages == 0:
        equal = (num_layers // stages,) * stages
        best = min(best, _descend(list(equal), seconds), key=seconds)
        if seconds(equal) <= (1 + tolerance) * seconds(best):
            return equal
    return best


def one_f_one_b_seconds(counts: Sequence[int], microbatches: int, layer_forward: float,
                        layer_backward: float, head: float, spread_head: bool = False) -> float:
    """Seconds of the 1F1B ticks in lock-step with ``counts`` layers per stage (as
    :func:`jaxsmp.pipeline.simulator.lockstep_time`, on the schedule's table at once).
    ``spread_head``: every tick in which the last stage runs a forward is followed by
    ``head / stages`` on every stage."""
    kinds, _ = op_arrays("interleaved", len(counts), microbatches)
    n = np.asarray(counts, float)
    forward = n * layer_forward
    if not spread_head:
        forward[-1] += head
    ops = np.where(kinds == 1, forward, np.where(kinds == 2, n * layer_backward, 0.0))
    ticks = ops.max(axis=1)
    if spread_head:
        ticks = ticks + np.where(kinds[:, -1] == 1, head / len(counts), 0.0)
    return float(ticks.sum())


def fused_seconds(counts: Sequence[int], microbatches: int, layer_forward: float,
                  layer_backward: float, head: float, spread_head: bool = False) -> float:
    """Seconds of 1F1B's fused lock-step ticks (:mod:`jaxsmp.pipeline.fused_ticks`):
    ``m + p - 1`` forward and as many backward slots, each as long as its busiest
    stage's layers, and ``m`` heads between them (``1/p`` of one with ``spread_head``)."""
    p, busiest = len(counts), max(counts)
    slots = (microbatches + p - 1) * busiest * (layer_forward + layer_backward)
    return slots + microbatches * head / (p if spread_head else 1)


def _descend(counts: list[int], seconds) -> tuple[int, ...]:
    """Moves single layers between neighbouring stages while the time improves."""
    current = seconds(counts)
    while True:
        moves = []
        for i in range(len(counts) - 1):
            for a, b in ((i, i + 1), (i + 1, i)):
                if counts[a] > 1:
                    c = list(counts)
                    c[a], c[b] = c[a] - 1, c[b] + 1
                    moves.append((seconds(c), c))
        if not moves or min(moves)[0] >= current:
            return tuple(counts)
        current, counts = min(moves)
