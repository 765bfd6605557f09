"""JAX entry points for the MPI FFI collectives (world = MPI_COMM_WORLD, one device per process).

Importing this module compiles the library if needed, initialises MPI (thread-multiple)
and registers the two custom-call targets for the CPU platform.
"""
from __future__ import annotations

import atexit
import ctypes
import itertools

import jax
import jax.numpy as jnp
import numpy as np

from collectives.differentiable import transpose_pair
from collectives.ffi import build
from collectives.layout import AxisName, axis_size

_lib = ctypes.CDLL(str(build.library_path()))
if (_rc := _lib.jaxsmp_mpi_init()) != 0:
    raise RuntimeError(f"MPI initialisation failed (code {_rc}; 2 = no MPI_THREAD_MULTIPLE)")
atexit.register(_lib.jaxsmp_mpi_finalize)
_TAG_UB = _lib.jaxsmp_mpi_tag_ub()
_tags = itertools.count()  # one tag per traced call site; same program -> same tags everywhere

ALL_GATHER, REDUCE_SCATTER = "jaxsmp_mpi_all_gather", "jaxsmp_mpi_reduce_scatter"
jax.ffi.register_ffi_target(ALL_GATHER, jax.ffi.pycapsule(_lib.JaxsmpMpiAllGather), platform="cpu")
jax.ffi.register_ffi_target(REDUCE_SCATTER, jax.ffi.pycapsule(_lib.JaxsmpMpiReduceScatter),
                            platform="cpu")


def rank() -> int:
    """This process's rank in MPI_COMM_WORLD."""
    return _lib.jaxsmp_mpi_rank()


def world_size() -> int:
    """Number of processes in MPI_COMM_WORLD."""
    return _lib.jaxsmp_mpi_size()


def _check_platform() -> None:
    if jax.default_backend() != "cpu":
        raise NotImplementedError(
            f"the MPI FFI collectives exchange host (CPU) buffers only; backend "
            f"{jax.default_backend()!r} has no NCCL/CUDA implementation here: use another algorithm")


def _expected_rank(axis_name: AxisName | None) -> jax.Array:
    """The rank this call must run on (checked in C++), or -1 outside shard_map."""
    if axis_name is None:
        return jnp.full((1,), -1, jnp.int32)
    if (p := axis_size(axis_name)) != world_size():
        raise ValueError(f"ffi collectives span MPI_COMM_WORLD ({world_size()} processes) but "
                         f"axis {axis_name!r} has {p} ranks: use one device per process")
    return jax.lax.axis_index(axis_name).astype(jnp.int32).reshape(1)


def _varying_axes(x: jax.Array) -> set[str]:
    aval = jax.typeof(x)
    mat = getattr(aval, "manual_axis_type", None)  # jax >= 0.10; older: aval.vma
    return set(mat.varying) if mat is not None else set(getattr(aval, "vma", ()))


def _call(target: str, lead: jax.Array, rows: int, axis_name: AxisName | None) -> jax.Array:
    _check_platform()
    out = jax.ShapeDtypeStruct((rows,) + lead.shape[1:], lead.dtype)
    tag = np.int64(next(_tags) % (_TAG_UB + 1))
    result = jax.ffi.ffi_call(target, out)(lead, _expected_rank(axis_name), tag=tag)
    return _varying(result, lead, axis_name)


def _varying(out: jax.Array, x: jax.Array, axis_name: AxisName | None) -> jax.Array:
    """Type the custom call's result as varying over the axis (and whatever ``x`` varies
    over) inside shard_map, as XLA's own collectives are."""
    names = _varying_axes(x)
    if axis_name is not None:
        names |= {axis_name} if isinstance(axis_name, str) else set(axis_name)
    missing = tuple(sorted(names - _varying_axes(out)))
    return jax.lax.pcast(out, missing, to="varying") if missing else out


def _all_gather(x: jax.Array, axis_name: AxisName | None, axis: int) -> jax.Array:
    lead = jnp.moveaxis(x, axis, 0)
    out = _call(ALL_GATHER, lead, world_size() * lead.shape[0], axis_name)
    return jnp.moveaxis(out, 0, axis)


def _reduce_scatter(x: jax.Array, axis_name: AxisName | None, axis: int) -> jax.Array:
    lead = jnp.moveaxis(x, axis, 0)
    rows, rem = divmod(lead.shape[0], world_size())
    if rem:
        raise ValueError(f"axis {axis} of shape {x.shape} is not divisible by {world_size()} ranks")
    return jnp.moveaxis(_call(REDUCE_SCATTER, lead, rows, axis_name), 0, axis)


_gather, _scatter = transpose_pair(_all_gather, _reduce_scatter)


def all_gather(x: jax.Array, axis_name: AxisName | None = None, axis: int = 0) -> jax.Array:
    """Tiled all-gather over MPI_COMM_WORLD. ``axis_name`` (inside shard_map) must be a mesh
    axis whose index equals the MPI rank; None under plain jit in each process."""
    return _gather(x, axis_name, axis % x.ndim)


def reduce_scatter(x: jax.Array, axis_name: AxisName | None = None, axis: int = 0) -> jax.Array:
    """Tiled reduce-scatter (sum) over MPI_COMM_WORLD; ``axis_name`` as in :func:`all_gather`."""
    return _scatter(x, axis_name, axis % x.ndim)
