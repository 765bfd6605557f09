"""Embedding lookups straight from ``sdp`` shards: ZeRO-3 without gathering the table.

An :class:`~jaxsmp.nn.Embed` table ``[vocab, embed]`` is sharded over ``sdp`` on its
``embed`` columns. Gathering it for a lookup moves and materialises the whole table
on every device (GPT-NeoX 125M: 50304 x 768, 155 MB in float32), and its gradient
is a scatter-add into a dense full-size table followed by a reduce-scatter of it.

Instead every rank looks up its own columns for the tokens of all ``sdp`` ranks (the
token ids are all-gathered: a few KB) and one all-to-all of the rows, ``[tokens, embed]``
in the compute dtype, hands each rank the full rows of its own tokens. The backward
pass is the reverse all-to-all and a float32 scatter-add into the local shard: no
table-sized buffer and no table-sized collective in either direction. This is the
column-parallel lookup of Megatron-style embeddings applied to the ZeRO-3 axis; on
GPUs it replaces a table-sized all-gather and reduce-scatter per microbatch by two
activation-sized all-to-alls.

The step swaps, for the duration of the user's loss function only, the class of each
plain ``Embed`` of the merged (per-trace) model for :class:`ShardedLookupEmbed`,
whose ``__call__`` reads the local shard. The table's ``Variable`` still holds the
gathered table for any other reader (``attend``, user code); when nothing reads it,
XLA drops that gather as dead code.
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

import jax
import jax.numpy as jnp
from flax import nnx

from jaxsmp.nn.embed import Embed

_SHARDS: contextvars.ContextVar[dict] = contextvars.ContextVar("jaxsmp_embed_shards",
                                                               default={})


def sharded_take(shard: jax.Array, tokens: jax.Array, dtype, axis_name: str = "sdp"
                 ) -> jax.Array:
    """``take(all_gather(shard, axis=1), tokens)`` in ``dtype`` without the gather.

    ``shard``: this rank's ``[vocab, embed / p]`` columns; ``tokens``: this rank's ids."""
    p = int(jax.lax.axis_size(axis_name))
    ids = jax.lax.all_gather(tokens, axis_name, axis=0)             # [p, *tokens]
    rows = jnp.take(shard, ids, axis=0).astype(dtype)               # [p, *tokens, d/p]
    rows = rows[..., None, :]                                       # [p, *tokens, 1, d/p]
    rows = jax.lax.all_to_all(rows, axis_name, 0, tokens.ndim + 1,  # [1, *tokens, p, d/p]
                              tiled=True)
    return rows.reshape(tokens.shape + (p * shard.shape[1],))


class ShardedLookupEmbed(Embed):
    """An :class:`Embed` whose lookup runs on its ``sdp`` shard (inside a step)."""

    def __call__(self, tokens: jax.Array) -> jax.Array:
        entry = _SHARDS.get().get(id(self))
        if entry is None:
            return super().__call__(tokens)
        shard, dtype = entry
        return sharded_take(shard, tokens, dtype)


def _embeds(model: nnx.Module) -> Iterator[tuple[tuple, Embed]]:
    for path, node in nnx.iter_graph(model):
        if type(node) is Embed:  # subclasses may override the lookup
            yield tuple(path), node


def lookup_tables(graphdef: nnx.GraphDef, params: nnx.State, sdp_dim) -> dict[int, tuple]:
    """``{id(variable): module path}`` of the ``Embed`` tables in ``params`` sharded over
    ``sdp`` on their columns (``sdp_dim(variable) == 1``)."""
    flat = {tuple(path): var for path, var in
            jax.tree_util.tree_flatten_with_path(params, is_leaf=lambda x: isinstance(
                x, nnx.Variable))[0]}
    keyed = {tuple(getattr(k, "key", getattr(k, "name", k)) for k in path): var
             for path, var in flat.items()}
    found = {}
    for path, _ in _embeds(nnx.merge(graphdef, params)):
        var = keyed.get(path + ("embedding",))
        if (var is not None and var[...].ndim == 2  # not stacked in a layer scan
                and jnp.issubdtype(var[...].dtype, jnp.floating) and sdp_dim(var) == 1):
            found[id(var)] = path
    return found


@contextlib.contextmanager
def sharded_lookups(model: nnx.Module, shards: dict[tuple, tuple]) -> Iterator[None]:
    """Within the block, the ``Embed`` modules of ``model`` at the paths of ``shards``
    (``{path: (local shard, compute dtype)}``) look up from their shards."""
    swapped = {}
    for path, node in _embeds(model):
        if path in shards:
            swapped[id(node)] = (node, shards[path])
    token = _SHARDS.set({**_SHARDS.get(), **{k: v[1] for k, v in swapped.items()}})
    for node, _ in swapped.values():
        object.__setattr__(node, "__class__", ShardedLookupEmbed)
    try:
        yield
    finally:
        for node, _ in swapped.values():
            object.__setattr__(node, "__class__", Embed)
        _SHARDS.reset(token)
