"""Pipeline schedules as tables: which op each stage runs at each tick.

An op is the forward (``F``) or backward (``B``) of one microbatch through one
chunk of a stage's layers; every op takes one tick. Stage ``s`` holds the chunks
``c`` whose virtual stage is ``c * stages + s``.

* ``simple`` (GPipe): all forwards, then all backwards (mirror order, as autodiff
  runs them). Bubble ``(p-1)/m``; every microbatch's activations are alive at once.
* ``interleaved`` (1F1B): after ``p-s-1`` warm-up forwards, stage ``s`` alternates
  one forward with one backward. Same bubble, at most ``p-s`` live activations.
* ``virtual``: ``v`` chunks per stage, microbatches go round the stages ``v`` times
  (circular GPipe), ``p`` at a time when ``p`` divides ``m`` (:func:`virtual_group`).
  Bubble ``(p-1)/(v*m)``; needs ``m >= p``.

Tables are built by a greedy list scheduler from each stage's op order and checked
by :mod:`jaxsmp.pipeline.simulator`.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

SCHEDULES = ("simple", "interleaved", "virtual")


@dataclass(frozen=True, order=True)
class Op:
    kind: str        # "F" or "B"
    microbatch: int
    chunk: int = 0

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")


@dataclass(frozen=True)
class Schedule:
    """``table[stage][tick]`` is the op run there, or ``None`` (idle)."""
    name: str
    stages: int
    microbatches: int
    chunks: int
    table: tuple[tuple[Op | None, ...], ...]

    @property
    def ticks(self) -> int:
        return len(self.table[0])

    def __str__(self) -> str:
        width = max(len(str(op)) for row in self.table for op in row if op) + 1
        lines = [f"{self.name}: {self.stages} stages, {self.microbatches} microbatches, "
                 f"{self.chunks} chunk(s)/stage, {self.ticks} ticks"]
        for s, row in enumerate(self.table):
            cells = "".join((str(op) if op else ".").ljust(width) for op in row)
            lines.append(f"stage {s}: {cells.rstrip()}")
        return "\n".join(lines)

    def draw(self, path: str) -> None:
        """Saves the timeline as a PNG."""
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(max(6, self.ticks * 0.35), 1 + 0.5 * self.stages))
        cmap = plt.get_cmap("tab10")
        for s, row in enumerate(self.table):
            for t, op in enumerate(row):
                if op is None:
                    continue
                shade = 1.0 if op.kind == "F" else 0.55
                ax.broken_barh([(t, 1)], (s - 0.4, 0.8), alpha=shade,
                               facecolors=cmap(op.microbatch % 10), edgecolor="black")
                ax.text(t + 0.5, s, str(op), ha="center", va="center", fontsize=7)
        ax.set_yticks(range(self.stages), [f"stage {s}" for s in range(self.stages)])
        ax.invert_yaxis()
        ax.set_xlabel("tick (F: solid, B: faded)")
        ax.set_title(f"{self.name}: p={self.stages}, m={self.microbatches}, v={self.chunks}")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)


def dependencies(op: Op, stage: int, stages: int, chunks: int) -> list[tuple[int, Op]]:
    """The (stage, op) pairs that must finish before ``op`` runs on ``stage``."""
    j, c = op.microbatch, op.chunk
    if op.kind == "F":
        if stage > 0:
            return [(stage - 1, Op("F", j, c))]
        return [(stages - 1, Op("F", j, c - 1))] if c > 0 else []
    deps = [(stage, Op("F", j, c))]
    if stage < stages - 1:
        deps.append((stage + 1, Op("B", j, c)))
    elif c < chunks - 1:
        deps.append((0, Op("B", j, c + 1)))
    return deps


def _greedy(orders: list[list[Op]], stages: int, chunks: int) -> list[list[Op | None]]:
    """Each tick, every stage runs its next op if all its dependencies are done."""
    done: dict[tuple[int, Op], int] = {}
    table: list[list[Op | None]] = [[] for _ in range(stages)]
    pos = [0] * stages
    tick = 0
    while any(pos[s] < len(orders[s]) for s in range(stages)):
        ran = []
        for s in range(stages):
            op = orders[s][pos[s]] if pos[s] < len(orders[s]) else None
            ready = op is not None and all(done.get(d, tick) < tick
                                           for d in dependencies(op, s, stages, chunks))
            table[s].append(op if ready else None)
            if ready:
                ran.append((s, op))
        if not ran:
            raise ValueError(f"schedule deadlocks at tick {tick}: stage orders {orders}")
        for s, op in ran:
            done[(s, op)] = tick
            pos[s] += 1
        tick += 1
    return table


def virtual_group(stages: int, microbatches: int, chunks: int) -> int:
    """Microbatches that go round the stages together: ``p`` when it divides ``m`` and
    there are chunks (Megatron's order: what comes back from the last stage is due at
    once), else all ``m`` (what comes back early waits at stage 0)."""
    return stages if chunks > 1 and microbatches % stages == 0 else microbatches


def item(k, group: int, chunks: int):
    """(chunk, microbatch) of a stage's ``k``-th forward: the group's microbatches
    through chunk 0, then through chunk 1, ..., then the next group's (ints or arrays)."""
    g, r = k // (group * chunks), k % (group * chunks)
    return r // group, g * group + r % group


def _gpipe_orders(stages: int, microbatches: int, chunks: int) -> list[list[Op]]:
    group = virtual_group(stages, microbatches, chunks)
    items = [Op("F", j, c) for c, j in (item(k, group, chunks)
                                        for k in range(microbatches * chunks))]
    backward = [Op("B", op.microbatch, op.chunk) for op in reversed(items)]
    return [items + backward for _ in range(stages)]


def _one_f_one_b_orders(stages: int, microbatches: int) -> list[list[Op]]:
    orders = []
    for s in range(stages):
        warmup = min(stages - s - 1, microbatches)
        order = [Op("F", j) for j in range(warmup)]
        for j in range(microbatches - warmup):
            order += [Op("F", warmup + j), Op("B", j)]
        order += [Op("B", j) for j in range(microbatches - warmup, microbatches)]
        orders.append(order)
    return orders


def check_microbatches(name: str, stages: int, microbatches: int) -> None:
    """``interleaved`` and ``virtual`` need at least as many microbatches as stages."""
    if name not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {name!r}; valid: {SCHEDULES}")
    if name != "simple" and microbatches < stages:
        raise ValueError(
            f"pipeline schedule {name!r} needs microbatches >= stages; got "
            f"microbatches={microbatches} for pp={stages} stages (use at least {stages})")


def make_schedule(name: str, stages: int, microbatches: int, chunks: int = 1) -> Schedule:
    """The table of schedule ``name`` (``chunks`` > 1 only for ``virtual``)."""
    check_microbatches(name, stages, microbatches)
    if stages < 1 or microbatches < 1 or chunks < 1:
        raise ValueError(f"stages, microbatches and chunks must be >= 1; got "
                         f"{stages}, {microbatches}, {chunks}")
    if name != "virtual" and chunks != 1:
        raise ValueError(f"schedule {name!r} has one chunk per stage; got chunks={chunks}")
    if name == "interleaved":
        orders = _one_f_one_b_orders(stages, microbatches)
    else:
        orders = _gpipe_orders(stages, microbatches, chunks)
    table = _greedy(orders, stages, chunks)
    return Schedule(name, stages, microbatches, chunks, tuple(tuple(r) for r in table))


@functools.lru_cache(maxsize=64)
def op_arrays(name: str, stages: int, microbatches: int) -> tuple[np.ndarray, np.ndarray]:
    """``(kind, microbatch)`` of schedule ``name`` (one chunk), each ``[tick, stage]``:
    kind 0 idle, 1 forward, 2 backward. Read-only: cached for the planner's searches."""
    table = make_schedule(name, stages, microbatches).table
    kind = np.array([[0 if op is None else 1 if op.kind == "F" else 2 for op in row]
                     for row in table], np.int32).T
    mb = np.array([[0 if op is None else op.microbatch for op in row] for row in table],
                  np.int32).T
    kind.flags.writeable = mb.flags.writeable = False
    return kind, mb


def bubble_formula(stages: int, microbatches: int, chunks: int = 1) -> float:
    """Idle over busy time per stage: ``(p-1) / (v*m)``."""
    return (stages - 1) / (chunks * microbatches)
