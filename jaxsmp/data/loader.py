"""Batches put on the devices, each host reading only its own rows, prepared on a
background thread while the previous step runs.

A source is anything with ``batch_size``, ``seq_len`` and ``rows(index, positions)``
(:class:`~jaxsmp.data.TokenBatches`, :class:`~jaxsmp.data.PackedBatches`).
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

import jax
import numpy as np

from jaxsmp.mesh import Mesh
from jaxsmp.sharding.rules import batch_spec


class Source(Protocol):
    batch_size: int
    seq_len: int

    def rows(self, index: int, positions: Sequence[int]) -> np.ndarray: ...


def local_positions(indices: Mapping[Any, tuple[slice, ...]], batch_size: int) -> list[int]:
    """The batch rows that the devices of ``indices`` (device -> index, as from
    ``Sharding.addressable_devices_indices_map``) hold, in order, each once."""
    rows = set()
    for index in indices.values():
        rows.update(range(*index[0].indices(batch_size)))
    return sorted(rows)


def device_batch(source: Source, index: int, mesh: Mesh) -> dict[str, jax.Array]:
    """Batch ``index`` as a global array sharded over the mesh's data axes; this host
    reads only the rows its own devices hold."""
    shape = (source.batch_size, source.seq_len)
    sharding = mesh.sharding(batch_spec(2))
    positions = local_positions(sharding.addressable_devices_indices_map(shape), shape[0])
    rows = source.rows(index, positions)
    where = {p: k for k, p in enumerate(positions)}

    def local(idx: tuple[slice, ...]) -> np.ndarray:
        return rows[[where[p] for p in range(*idx[0].indices(shape[0]))]][:, idx[1]]
    return {"tokens": jax.make_array_from_callback(shape, sharding, local)}


class Prefetcher:
    """Iterates over ``device_batch(source, i, mesh)`` for ``i`` in ``steps``, keeping
    up to ``depth`` batches ready on a background thread (``depth=0``: inline).
    An error raised while preparing a batch is raised by ``next()``."""

    def __init__(self, source: Source, mesh: Mesh, steps: range, depth: int = 2):
        self.source, self.mesh, self.steps, self.depth = source, mesh, steps, depth
        self._queue: queue.Queue = queue.Queue(maxsize=max(depth, 1))
        self._stop = threading.Event()
        self._thread = None
        if depth > 0:
            self._thread = threading.Thread(target=self._fill, name="jaxsmp-prefetch", daemon=True)
            self._thread.start()

    def _fill(self) -> None:
        for i in self.steps:
            try:
                item = (i, device_batch(self.source, i, self.mesh), None)
            except BaseException as err:  # handed to the consumer
                item = (i, None, err)
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if self._stop.is_set() or item[2] is not None:
                return

    def __iter__(self) -> Iterator[tuple[int, dict[str, jax.Array]]]:
        if self._thread is None:
            for i in self.steps:
                yield i, device_batch(self.source, i, self.mesh)
            return
        for _ in self.steps:
            i, batch, err = self._queue.get()
            if err is not None:
                raise err
            yield i, batch

    def close(self) -> None:
        """Stops the background thread (batches already prepared are dropped)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
