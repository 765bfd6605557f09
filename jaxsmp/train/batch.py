"""Checking, placing and splitting the global batch."""
from __future__ import annotations

from typing import Any

import jax
import numpy as np

from jaxsmp.mesh import Mesh
from jaxsmp.sharding.rules import batch_spec


def check_batch(batch: Any, mesh: Mesh, microbatches: int) -> int:
    """The global batch size, after checking it splits over data axes x microbatches."""
    sizes = {np.shape(x)[0] if np.ndim(x) else None for x in jax.tree.leaves(batch)}
    if len(sizes) != 1 or None in sizes:
        raise ValueError(f"every batch leaf needs the same leading batch dimension; got {sizes}")
    size = sizes.pop()
    need = mesh.data_size * microbatches
    if size % need:
        raise ValueError(
            f"global batch size {size} is not divisible by dp*sdp ({mesh.data_size}) x "
            f"microbatches ({microbatches}) = {need}; use a multiple of {need}")
    return size


def place_batch(batch: Any, mesh: Mesh, microbatches: int) -> Any:
    """Shards the global batch over (dp, sdp). Host arrays are the *global* batch;
    with several processes each copies only the rows its own devices hold."""
    check_batch(batch, mesh, microbatches)

    def place(x):
        sharding = mesh.sharding(batch_spec(np.ndim(x)))
        if isinstance(x, jax.Array):
            return x if x.sharding == sharding else jax.device_put(x, sharding)
        if jax.process_count() > 1:
            host = np.asarray(x)
            return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])
        return jax.device_put(x, sharding)
    return jax.tree.map(place, batch)


def split_microbatches(batch: Any, microbatches: int) -> Any:
    """``[b, ...]`` -> ``[microbatches, b // microbatches, ...]`` (contiguous rows)."""
    def split(x):
        return x.reshape(microbatches, x.shape[0] // microbatches, *x.shape[1:])
    return jax.tree.map(split, batch)


def to_host(x: jax.Array) -> np.ndarray:
    """A replicated result as a host array, also when other processes hold devices."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return np.asarray(x.addressable_data(0))
    return np.asarray(x)
