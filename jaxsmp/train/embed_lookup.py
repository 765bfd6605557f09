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

The step hands :func:`lookup_hook` to the layer context; ``jaxsmp.nn.Embed`` asks it
for its rows before falling back to ``take``. The table's ``Variable`` still holds
the gathered table for any other reader (``attend``, user code); when nothing reads
it, XLA drops that gather as dead code.
"""
from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from collectives import axis_names
from jaxsmp.nn.param import is_var, logical_axes


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


def is_lookup_table(var: nnx.Variable, sdp_dim: Callable[[nnx.Variable], int | None]) -> bool:
    """A 2-D ``[vocab, embed]`` float table split over sdp on its columns."""
    value = var[...]
    return (value.ndim == 2 and jnp.issubdtype(value.dtype, jnp.floating)
            and logical_axes(var) == ("vocab", "embed") and sdp_dim(var) == 1)


def _whole_over_cp(var: nnx.Variable) -> jax.Array:
    """The local shard gathered over an automatic ``cp`` (context parallelism shards it
    with sdp) when ``tp`` splits it too: XLA's SPMD partitioner aborts on a lookup from a
    table split over cp and tp (jax 0.11.2, 0.12.0.1); with tp = 1 it partitions it."""
    mesh, value = jax.sharding.get_abstract_mesh(), var[...]
    if (mesh.empty or mesh.shape.get("cp", 1) == 1 or mesh.shape.get("tp", 1) == 1
            or "cp" in mesh.manual_axes):
        return value

    def keep(dim):
        kept = tuple(a for a in axis_names(dim) if a != "cp" and a not in mesh.manual_axes)
        return kept[0] if len(kept) == 1 else (kept or None)
    spec = P(*[keep(d) for d in var.get_metadata()["mesh_axes"]])
    return jax.lax.with_sharding_constraint(value, NamedSharding(mesh, spec))


def lookup_hook(local: nnx.State, gathered: nnx.State, tables: set[int], dtype
                ) -> Callable[[nnx.Variable, jax.Array], jax.Array | None]:
    """``hook(table_variable, tokens)``: rows from the local shard for the tables
    (``id`` in ``tables`` of a ``local`` variable; ``gathered`` has the same structure),
    ``None`` for any other table."""
    shards = {id(g): _whole_over_cp(l) for l, g in zip(jax.tree.leaves(local, is_leaf=is_var),
                                                        jax.tree.leaves(gathered, is_leaf=is_var))
              if id(l) in tables}

    def hook(table: nnx.Variable, tokens: jax.Array) -> jax.Array | None:
        shard = shards.get(id(table))
        return None if shard is None else sharded_take(shard, tokens, dtype)
    return hook
