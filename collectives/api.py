"""Public entry points: ``all_gather`` and ``reduce_scatter`` by algorithm name."""
from __future__ import annotations

import functools
from collections.abc import Callable

import jax

from collectives import a2a, auto, hierarchical, ring, xla
from collectives.context import current
from collectives.layout import AxisName, axis_names, axis_size
from collectives.topology import Topology

# (x, axis_name, axis, topology) -> array, where topology describes the ranks of axis_name.
Collective = Callable[[jax.Array, AxisName, int, Topology], jax.Array]


def _ffi(op: str) -> Collective:
    def run(x, axis_name, axis, topo):
        from collectives.ffi import ops  # compiles the MPI library on first use
        return getattr(ops, op)(x, axis_name, axis)
    return run


def _hierarchical(fn: Callable) -> Collective:
    return lambda x, axis_name, axis, topo: fn(x, axis_name, axis, topo.devices_per_host)


def _plain(fn: Callable) -> Collective:
    return lambda x, axis_name, axis, topo: fn(x, axis_name, axis)


# name -> (all_gather, reduce_scatter)
ALGORITHMS: dict[str, tuple[Collective, Collective]] = {
    "xla": (_plain(xla.all_gather), _plain(xla.reduce_scatter)),
    "ring": (_plain(ring.all_gather), _plain(ring.reduce_scatter)),
    "a2a": (_plain(a2a.all_gather), _plain(a2a.reduce_scatter)),
    "hierarchical": (_hierarchical(hierarchical.all_gather),
                     _hierarchical(hierarchical.reduce_scatter)),
    "ffi": (_ffi("all_gather"), _ffi("reduce_scatter")),
}


def _lookup(algorithm: str) -> tuple[Collective, Collective]:
    try:
        return ALGORITHMS[algorithm]
    except KeyError:
        raise ValueError(
            f"unknown collectives algorithm {algorithm!r}; valid: {sorted(ALGORITHMS) + ['auto']}"
        ) from None


def axis_topology(axis_name: AxisName, topology: Topology | None = None) -> Topology:
    """Topology of the ranks of ``axis_name`` (inside shard_map): hosts x ranks per host.

    Without ``topology``: from the mesh of :func:`collectives.scope` if it has these axes,
    else :meth:`Topology.from_devices` (one host per JAX process) with consecutive ranks of
    the axis filling a host first. Only speed depends on it, never results.
    """
    p = axis_size(axis_name)
    names = axis_names(axis_name)
    mesh = current().mesh
    if topology is None and mesh is not None and set(names) <= set(mesh.axis_names):
        return _mesh_axis_topology(mesh, names)
    g = (topology or Topology.from_devices()).group_size(p)
    return Topology(hosts=p // g, devices_per_host=g)


@functools.lru_cache(maxsize=64)
def _mesh_axis_topology(mesh: jax.sharding.Mesh, names: tuple[str, ...]) -> Topology:
    return Topology.for_mesh_axis(mesh, names)


def _resolve(algorithm: str, op: str, nbytes: int, topo: Topology, axis_name: AxisName) -> str:
    if algorithm != "auto":
        return algorithm
    from collectives.ffi.mpi_env import usable
    ffi_ok, _ = usable(current().mesh, axis_names(axis_name))
    decision = auto.decide(nbytes, topo, op=op, ffi=ffi_ok)
    if current().decisions is not None:
        current().decisions.append((op, decision))
    return decision.pick


def all_gather(x: jax.Array, axis_name: AxisName, *, axis: int = 0,
               algorithm: str = "xla", topology: Topology | None = None) -> jax.Array:
    """Concatenate every rank's ``x`` along ``axis`` (tiled), over mesh axis ``axis_name``.

    Differentiable: the gradient is the matching reduce-scatter of the same algorithm.
    """
    topo = axis_topology(axis_name, topology)
    name = _resolve(algorithm, "all_gather", x.size * x.dtype.itemsize, topo, axis_name)
    return _lookup(name)[0](x, axis_name, axis % x.ndim, topo)


def reduce_scatter(x: jax.Array, axis_name: AxisName, *, axis: int = 0,
                   algorithm: str = "xla", topology: Topology | None = None) -> jax.Array:
    """Sum ``x`` over ``axis_name`` and keep this rank's tile along ``axis``.

    Differentiable: the gradient is the matching all-gather of the same algorithm.
    """
    topo = axis_topology(axis_name, topology)
    name = _resolve(algorithm, "reduce_scatter", x.size * x.dtype.itemsize // topo.size, topo,
                    axis_name)
    return _lookup(name)[1](x, axis_name, axis % x.ndim, topo)
