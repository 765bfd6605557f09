"""Checking, placing and splitting the global batch."""
from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxsmp.mesh import Mesh
from jaxsmp.sharding.rules import batch_spec


def check_batch(batch: Any, mesh: Mesh, microbatches: int) -> int:
    """The global batch size, after checking it splits over data axes x microbatches."""
    sizes = {_global_rows(x) for x in jax.tree.leaves(batch)}
    if len(sizes) != 1 or None in sizes:
        raise ValueError(f"every batch leaf needs the same leading batch dimension; got {sizes}")
    size = sizes.pop()
    need = mesh.data_size * microbatches
    if size % need:
        raise ValueError(
            f"global batch size {size} is not divisible by dp*sdp ({mesh.data_size}) x "
            f"microbatches ({microbatches}) = {need}; use a multiple of {need}")
    return size


def _global_rows(x: Any) -> int | None:
    """Rows in the global batch: a host array holds this process's rows only."""
    if not np.ndim(x):
        return None
    if isinstance(x, jax.Array) or jax.process_count() == 1:
        return np.shape(x)[0]
    return np.shape(x)[0] * jax.process_count()


def place_batch(batch: Any, mesh: Mesh, microbatches: int) -> Any:
    """Shards the batch over (dp, sdp). With several processes each passes its own rows."""
    check_batch(batch, mesh, microbatches)

    def place(x):
        sharding = mesh.sharding(batch_spec(np.ndim(x)))
        if isinstance(x, jax.Array) and x.sharding == sharding:
            return x
        if jax.process_count() > 1:
            return jax.make_array_from_process_local_data(sharding, np.asarray(x))
        return jax.device_put(x, sharding)
    return jax.tree.map(place, batch)


def split_microbatches(batch: Any, microbatches: int) -> Any:
    """``[b, ...]`` -> ``[microbatches, b // microbatches, ...]`` (contiguous rows)."""
    def split(x):
        return x.reshape(microbatches, x.shape[0] // microbatches, *x.shape[1:])
    return jax.tree.map(split, batch)
