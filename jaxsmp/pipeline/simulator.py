"""Checks a schedule table and measures its bubble and activation memory.

Independent of how the table was built: every (stage, chunk, microbatch) has
exactly one forward and one backward, the forward first; every op's inputs
(:func:`jaxsmp.pipeline.schedule.dependencies`) finished at an earlier tick.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from jaxsmp.pipeline.schedule import Op, Schedule, dependencies


@dataclass(frozen=True)
class Report:
    ticks: int
    busy: tuple[int, ...]          # ops per stage
    idle: tuple[int, ...]          # idle ticks per stage
    peak_activations: tuple[int, ...]  # most forwards awaiting their backward, per stage

    @property
    def bubble(self) -> float:
        """Idle over busy ticks, worst stage (``(p-1)/(v*m)`` for a tight schedule)."""
        return max(i / b for i, b in zip(self.idle, self.busy))

    @property
    def idle_fraction(self) -> tuple[float, ...]:
        return tuple(i / self.ticks for i in self.idle)


def _check_coverage(schedule: Schedule) -> dict[tuple[int, Op], int]:
    when: dict[tuple[int, Op], int] = {}
    for s, row in enumerate(schedule.table):
        counts = Counter(op for op in row if op is not None)
        repeated = [str(op) for op, n in counts.items() if n > 1]
        if repeated:
            raise ValueError(f"stage {s} runs {repeated} more than once")
        want = {Op(k, j, c) for k in "FB" for j in range(schedule.microbatches)
                for c in range(schedule.chunks)}
        if set(counts) != want:
            raise ValueError(f"stage {s}: missing {sorted(map(str, want - set(counts)))}, "
                             f"unexpected {sorted(map(str, set(counts) - want))}")
        when.update({(s, op): t for t, op in enumerate(row) if op is not None})
    return when


def _peak(row: tuple[Op | None, ...]) -> int:
    live, peak = 0, 0
    for op in row:
        if op is not None:
            live += 1 if op.kind == "F" else -1
            peak = max(peak, live)
    return peak


def simulate(schedule: Schedule) -> Report:
    """Validates ``schedule`` (raises ``ValueError``) and returns its :class:`Report`."""
    if len({len(r) for r in schedule.table}) != 1 or len(schedule.table) != schedule.stages:
        raise ValueError("schedule table must have one row per stage, all of equal length")
    when = _check_coverage(schedule)
    for (s, op), t in when.items():
        for dep in dependencies(op, s, schedule.stages, schedule.chunks):
            if when[dep] >= t:
                raise ValueError(f"stage {s} runs {op} at tick {t} before its input "
                                 f"{dep[1]} on stage {dep[0]} (tick {when[dep]})")
    busy = tuple(sum(op is not None for op in row) for row in schedule.table)
    return Report(ticks=schedule.ticks, busy=busy,
                  idle=tuple(schedule.ticks - b for b in busy),
                  peak_activations=tuple(_peak(row) for row in schedule.table))


@dataclass(frozen=True)
class Timing:
    """A schedule's time when its ops take given durations."""
    step: float                 # seconds, first op to last
    busy: tuple[float, ...]     # seconds of ops per stage

    @property
    def idle_fraction(self) -> tuple[float, ...]:
        return tuple(1 - b / self.step for b in self.busy)


def lockstep_time(schedule: Schedule, duration) -> Timing:
    """:class:`Timing` of ``schedule`` run in lock-step, as jaxsmp's SPMD runners run
    it: every tick lasts as long as its slowest op (the stages exchange activations
    at the end of every tick). ``duration(stage, op)`` is an op's time in seconds."""
    simulate(schedule)
    ticks = [max((duration(s, row[t]) for s, row in enumerate(schedule.table)
                  if row[t] is not None), default=0.0) for t in range(schedule.ticks)]
    busy = tuple(sum(duration(s, op) for op in row if op is not None)
                 for s, row in enumerate(schedule.table))
    return Timing(step=sum(ticks), busy=busy)


def async_time(schedule: Schedule, duration) -> Timing:
    """:class:`Timing` of ``schedule``'s per-stage op order run asynchronously (each op
    starts once its stage is free and its inputs are done, as MPMD runtimes run
    pipelines), for comparison with :func:`lockstep_time`."""
    simulate(schedule)
    orders = [[op for op in row if op is not None] for row in schedule.table]
    end: dict = {}
    free, pos = [0.0] * schedule.stages, [0] * schedule.stages
    while any(p < len(o) for p, o in zip(pos, orders)):
        for s, order in enumerate(orders):
            while pos[s] < len(order):
                op = order[pos[s]]
                deps = dependencies(op, s, schedule.stages, schedule.chunks)
                if any(d not in end for d in deps):
                    break
                start = max([free[s]] + [end[d] for d in deps])
                free[s] = end[(s, op)] = start + duration(s, op)
                pos[s] += 1
    busy = tuple(sum(duration(s, op) for op in order) for s, order in enumerate(orders))
    return Timing(step=max(free), busy=busy)
