"""The step's ``shard_map``: manual over the mesh's data and pipeline axes of size > 1.

Inside it every device holds its batch rows and its ``sdp`` shards of the float32
master parameters; ``tp`` stays automatic (GSPMD places the Megatron splits).
Parameters are marked as differing per data replica before use, so that their
gradients stay local until one float32 sum over the replicas.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from flax import nnx
from jax.sharding import PartitionSpec as P

import collectives
from jaxsmp.mesh import Mesh
from jaxsmp.nn.fp8 import Fp8Meta
from jaxsmp.nn.param import is_var
from jaxsmp.sharding.rules import batch_spec
from jaxsmp.train.param_gather import mesh_axes, summed_in


def manual_spec(axes: tuple, manual: tuple[str, ...]) -> P:
    """The ``shard_map`` spec of an array split over mesh ``axes``: only its ``manual`` axes."""
    def keep(dim):
        kept = tuple(a for a in collectives.axis_names(dim) if a in manual)
        return kept[0] if len(kept) == 1 else (kept or None)
    return P(*[keep(d) for d in axes])


def param_specs(params: nnx.State, mesh: Mesh) -> Any:
    return jax.tree.map(lambda v: manual_spec(mesh_axes(v), mesh.manual_axes), params,
                        is_leaf=is_var)


def batch_specs(batch: Any, mesh: Mesh) -> Any:
    return jax.tree.map(lambda x: manual_spec(tuple(batch_spec(x.ndim)), mesh.manual_axes),
                        batch)


def shard_map(body: Callable, mesh: Mesh, in_specs, out_specs) -> Callable:
    """``body`` manual over ``mesh.manual_axes``; with none (e.g. a ``tp``-only mesh)
    ``body`` itself, on the global arrays, which GSPMD partitions. The collectives
    traced inside see the mesh (host groups for ``auto``, MPI groups for ``ffi``), in a
    scope that traces one program (distinct ``ffi`` tags across nested maps)."""
    mapped = body if not mesh.manual_axes else jax.shard_map(
        body, mesh=mesh.jax_mesh, axis_names=set(mesh.manual_axes), in_specs=in_specs,
        out_specs=out_specs)

    def run(*args):
        with collectives.scope(mesh=mesh.jax_mesh, one_program=True):
            return mapped(*args)
    return run


def _replica_axes(var: nnx.Variable, mesh: Mesh) -> tuple[str, ...]:
    """The manual data axes a parameter is replicated over: dp, ep unless the parameter
    is split over it (a mixture of experts' experts: each ep device owns its own, and the
    all-to-all brings it every token's gradient), and sdp unless split over it."""
    split = {a for d in mesh_axes(var) for a in collectives.axis_names(d)}
    return tuple(a for a in mesh.data_axes if a not in split)


def vary_over_replicas(params: nnx.State, mesh: Mesh) -> nnx.State:
    """Marks parameters as differing per replica, so that their gradients stay local
    (summed once, in float32, by :func:`sum_over_replicas`) rather than being summed
    implicitly where they are used in the compute dtype."""
    return jax.tree.map(lambda v: v.replace(jax.lax.pcast(v[...], _replica_axes(v, mesh),
                                                          to="varying")),
                        params, is_leaf=is_var)


def sum_over_replicas(grads: nnx.State, mesh: Mesh, dtype=None) -> nnx.State:
    """Gradients summed over the data replicas, in ``dtype`` (None: their own) and
    returned in their own; fp8 amax observations (the cotangents of
    :class:`~jaxsmp.nn.fp8.Fp8Meta` histories) take the maximum instead."""
    def reduce(g):
        axes = _replica_axes(g, mesh)
        if isinstance(g, Fp8Meta):
            return g.replace(jax.lax.pmax(g[...], axes))
        x = g[...]
        if not axes or dtype is None or dtype == x.dtype:
            return g.replace(jax.lax.psum(x, axes))
        low = summed_in(lambda y: jax.lax.psum(y, axes), x.astype(dtype))
        return g.replace(low.astype(x.dtype))
    return jax.tree.map(reduce, grads, is_leaf=is_var)


def mean_over_data(tree: Any, mesh: Mesh) -> Any:
    """Loss and metrics averaged over the data-parallel devices."""
    return jax.tree.map(lambda x: jax.lax.pmean(x, mesh.data_axes), tree)
