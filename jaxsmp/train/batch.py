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
    for x in jax.tree.leaves(batch):
        if mesh.cp > 1 and np.ndim(x) >= 2 and np.shape(x)[1] % (2 * mesh.cp):
            raise ValueError(
                f"context parallelism splits each sequence into 2*cp = {2 * mesh.cp} chunks "
                f"(cp={mesh.cp}), but a batch leaf has sequence length {np.shape(x)[1]}; use "
                f"a multiple of {2 * mesh.cp}")
    need = mesh.data_size * microbatches
    if size % need:
        raise ValueError(
            f"global batch size {size} is not divisible by dp*ep*sdp ({mesh.data_size}) x "
            f"microbatches ({microbatches}) = {need}; use a multiple of {need}")
    return size


def check_batch_tokens(batch: Any, vocab_size: int) -> None:
    """``batch["tokens"]``, if present, must be integer ids ``[batch, seq]``, and on the
    host within ``[0, vocab_size)``: out of range they would make the embedding lookup
    return garbage or NaN silently. The range check costs one min/max pass over the
    host array (microseconds per thousand tokens); arrays already on devices are not
    read back."""
    tokens = batch.get("tokens") if isinstance(batch, dict) else None
    if tokens is None:
        return
    dtype, shape = np.dtype(tokens.dtype), tuple(np.shape(tokens))
    if len(shape) != 2 or not np.issubdtype(dtype, np.integer):
        raise ValueError(f"batch['tokens'] must be integer ids of shape [batch, seq], got "
                         f"{dtype}{list(shape)}")
    if isinstance(tokens, (jax.Array, jax.ShapeDtypeStruct)) or not tokens.size:
        return
    tokens = np.asarray(tokens)
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        where = tuple(int(i) for i in np.argwhere(tokens == bad)[0])
        raise ValueError(f"token id {bad} at batch['tokens']{list(where)} is outside the "
                         f"model's vocabulary [0, {vocab_size})")


def place_batch(batch: Any, mesh: Mesh, microbatches: int, vocab_size: int | None = None) -> Any:
    """Shards the global batch over (dp, sdp). Host arrays are the *global* batch;
    with several processes each copies only the rows its own devices hold. With
    ``vocab_size``, ``batch["tokens"]`` is checked (:func:`check_batch_tokens`)."""
    if vocab_size is not None:
        check_batch_tokens(batch, vocab_size)
    check_batch(batch, mesh, microbatches)

    def place(x):
        sharding = mesh.sharding(batch_spec(np.ndim(x)))
        if isinstance(x, jax.ShapeDtypeStruct):  # abstract: for lowering only
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
        if isinstance(x, jax.Array):
            return x if x.sharding == sharding else jax.device_put(x, sharding)
        if jax.process_count() > 1:
            host = np.asarray(x)
            return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])
        return jax.device_put(x, sharding)
    return jax.tree.map(place, batch)


def to_host(x: jax.Array) -> np.ndarray:
    """A replicated result as a host array, also when other processes hold devices."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return np.asarray(x.addressable_data(0))
    return np.asarray(x)
