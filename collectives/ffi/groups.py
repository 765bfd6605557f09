"""Which processes hold the ranks of a mesh axis, and the MPI channels that connect them.

For a collective over ``names`` (one mesh axis or a tuple), every combination of the other
axes' coordinates is one *group* of ``p`` ranks. A group must be laid out as ``h`` blocks of
``k`` consecutive ranks, one block per process (``k = p`` when the group lives in one
process). The ``ffi`` algorithm gathers across processes over MPI, among the ranks with the
same position ``j`` in their block, then within the process with XLA's collective. Each such
set of ``h`` ranks is a *channel*: one MPI communicator, whose rank ``b`` is the device of
block ``b``. Everything here is computed identically by every process from the mesh alone.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

Names = tuple[str, ...]


@dataclass(frozen=True)
class AxisGroups:
    """The process layout of the groups of axis ``names`` of one mesh.

    ``channels[c]``: the process (``process_index``) of each channel rank. ``where[d]``:
    ``(channel index, channel rank)`` of the device at flat position ``d`` of the mesh
    (``-1, -1`` when its group lives in one process).
    """

    names: Names
    ranks: int            # p: ranks per group
    per_process: int      # k: consecutive ranks of a group in one process
    processes: int        # h: processes per group (p = h * k)
    channels: tuple[tuple[int, ...], ...]
    where: tuple[tuple[int, int], ...]


def _group_rows(devices: np.ndarray, axis_names: Sequence[str], names: Names) -> np.ndarray:
    """Flat mesh positions, one row per group, ranks of ``names`` along each row."""
    others = [n for n in axis_names if n not in names]
    order = [list(axis_names).index(n) for n in others + list(names)]
    p = math.prod(devices.shape[list(axis_names).index(n)] for n in names)
    flat = np.arange(devices.size).reshape(devices.shape)
    return flat.transpose(order).reshape(-1, p)


def _block_size(procs: np.ndarray, names: Names) -> int:
    """k such that every row is h blocks of k ranks on one process each, h processes distinct."""
    p = procs.shape[1]
    for k in sorted({math.gcd(p, j) for j in range(1, p + 1)}, reverse=True):
        blocks = procs.reshape(procs.shape[0], p // k, k)
        if (blocks == blocks[:, :, :1]).all() and all(
                len(set(row[:, 0])) == p // k for row in blocks):
            return k
    raise ValueError(
        f"the ffi collectives need each group of axis {names} laid out as consecutive blocks "
        f"of ranks, one block per process; the processes along it are {procs[0].tolist()} "
        f"(order the mesh devices by process, or use another algorithm)")


def axis_groups(devices: np.ndarray, axis_names: Sequence[str], names: Names) -> AxisGroups:
    """The groups of ``names`` on a mesh whose ``devices`` have a ``process_index``."""
    missing = [n for n in names if n not in axis_names]
    if missing:
        raise ValueError(f"axes {missing} are not in the mesh {tuple(axis_names)}")
    rows = _group_rows(devices, axis_names, names)
    proc_of = np.vectorize(lambda d: d.process_index, otypes=[int])(devices).reshape(-1)
    procs = proc_of[rows]
    p = rows.shape[1]
    k = _block_size(procs, names)
    h = p // k
    where = [(-1, -1)] * devices.size
    channels = []
    if h > 1:
        for row in rows:
            for j in range(k):
                members = row[j::k]  # rank b*k + j of the group: channel rank b
                for b, d in enumerate(members):
                    where[d] = (len(channels), b)
                channels.append(tuple(int(proc_of[d]) for d in members))
    return AxisGroups(names, p, k, h, tuple(channels), tuple(where))


def split_rounds(channels: Sequence[tuple[int, ...]]) -> list[list[int]]:
    """Channels in rounds of ``MPI_Comm_split`` (a process joins at most one per round):
    greedy colouring in channel order, the same on every process."""
    rounds: list[list[int]] = []
    busy: list[set[int]] = []
    for c, members in enumerate(channels):
        for r, taken in enumerate(busy):
            if taken.isdisjoint(members):
                rounds[r].append(c)
                taken.update(members)
                break
        else:
            rounds.append([c])
            busy.append(set(members))
    return rounds
