"""JAX entry points for the MPI FFI collectives.

Importing this module compiles the library if needed (with the CUDA handlers when JAX's
backend is a GPU), initialises MPI (thread-multiple) and registers the two custom-call
targets. Inside ``jax.shard_map`` with ``collectives.scope(mesh=...)`` the collective runs
per group of the axis: across processes over one MPI communicator per channel (see
:mod:`collectives.ffi.groups`), within a process with XLA's collective. Without a mesh the
axis must span ``MPI_COMM_WORLD``, one device per process; with ``axis_name=None`` (plain
``jit`` in each process) it gathers over the world.
"""
from __future__ import annotations

import atexit
import ctypes
import os
from importlib.util import find_spec

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from collectives import xla
from collectives.context import current as current_scope
from collectives.differentiable import transpose_pair
from collectives.ffi import build, callsite
from collectives.ffi.groups import AxisGroups, axis_groups, split_rounds
from collectives.hierarchical import gather_two_level, scatter_two_level
from collectives.layout import AxisName, axis_names, axis_size

DEFAULT_TIMEOUT = 300.0  # seconds a collective waits for its peers

def _wants_cuda() -> tuple[bool, str]:
    """Whether to build the CUDA handlers, decided without starting JAX's backend (so that
    ``jax.distributed.initialize`` can still follow): the backend if it has started, else a
    CUDA plugin installed and not excluded by ``$JAX_PLATFORMS``."""
    from jax._src import xla_bridge
    if xla_bridge.backends_are_initialized():
        return jax.default_backend() == "gpu", "the backend is " + jax.default_backend()
    platforms = (jax.config.jax_platforms or os.environ.get("JAX_PLATFORMS") or "").lower()
    if platforms and not {"cuda", "gpu"} & set(platforms.split(",")):
        return False, f"JAX_PLATFORMS={platforms}"
    plugins = [m for m in ("jax_cuda12_plugin", "jax_cuda13_plugin") if find_spec(m)]
    return bool(plugins), f"CUDA plugin: {plugins or 'none installed'}"


def _load() -> tuple[ctypes.CDLL, str | None]:
    """The library (with the CUDA handlers when wanted and nvcc is there), and why there are
    no CUDA handlers if there are none."""
    cuda, why = _wants_cuda()
    if cuda:
        try:
            return ctypes.CDLL(str(build.library_path(cuda=True))), None
        except build.NoCudaCompiler as e:
            why = str(e)
    return ctypes.CDLL(str(build.library_path())), f"built for CPU only ({why})"


_lib, NO_CUDA = _load()
if (_rc := _lib.jaxsmp_mpi_init()) != 0:
    raise RuntimeError(f"MPI initialisation failed (code {_rc}; 2 = no MPI_THREAD_MULTIPLE)")
atexit.register(_lib.jaxsmp_mpi_finalize)
_TAG_UB = _lib.jaxsmp_mpi_tag_ub()

ALL_GATHER, REDUCE_SCATTER = "jaxsmp_mpi_all_gather", "jaxsmp_mpi_reduce_scatter"
for _target, _symbol in ((ALL_GATHER, "JaxsmpMpiAllGather"),
                         (REDUCE_SCATTER, "JaxsmpMpiReduceScatter")):
    jax.ffi.register_ffi_target(_target, jax.ffi.pycapsule(getattr(_lib, _symbol)),
                                platform="cpu")
    if NO_CUDA is None:
        jax.ffi.register_ffi_target(_target, jax.ffi.pycapsule(getattr(_lib, _symbol + "Cuda")),
                                    platform="CUDA")


def rank() -> int:
    """This process's rank in MPI_COMM_WORLD."""
    return _lib.jaxsmp_mpi_rank()


def world_size() -> int:
    """Number of processes in MPI_COMM_WORLD."""
    return _lib.jaxsmp_mpi_size()


def cuda_aware() -> bool:
    """Whether the CUDA handlers hand device pointers to MPI (else they stage through pinned
    host buffers): ``$JAXSMP_MPI_CUDA_AWARE`` (0/1) if set, else what MPI reports."""
    if NO_CUDA:
        raise RuntimeError(f"no CUDA handlers in this library: {NO_CUDA}")
    return bool(_lib.jaxsmp_mpi_cuda_aware())


def broadcast(data: bytes, size: int, root: int = 0) -> bytes:
    """``data`` (padded to ``size`` bytes) of world rank ``root``, on every rank; collective."""
    buf = ctypes.create_string_buffer(data[:size], size)
    if _lib.jaxsmp_mpi_bcast(buf, size, root):
        raise RuntimeError("MPI_Bcast failed")
    return buf.raw


def timeout_seconds() -> float:
    """How long a collective waits for its peers: ``collectives.scope(timeout=...)``, else
    ``$JAXSMP_COLLECTIVES_TIMEOUT``, else :data:`DEFAULT_TIMEOUT`."""
    if (t := current_scope().timeout) is not None:
        return float(t)
    raw = os.environ.get("JAXSMP_COLLECTIVES_TIMEOUT")
    if raw is None:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"JAXSMP_COLLECTIVES_TIMEOUT={raw!r} must be a positive number of seconds")
    return value


_channels: dict = {}  # (mesh, names) -> (AxisGroups, first channel id)


def _channel_count() -> int:
    return sum(len(g.channels) for g, _ in _channels.values())


def groups_for(mesh: jax.sharding.Mesh, names: tuple[str, ...]) -> tuple[AxisGroups, int]:
    """The groups of ``names`` on ``mesh`` and the id of their first channel, creating the
    channels' communicators on first use. Collective over the world: every process must ask
    for the same (mesh, names) in the same order, as tracing the same program does."""
    key = (mesh, names)
    if key not in _channels:
        groups = axis_groups(mesh.devices, mesh.axis_names, names)
        base = _channel_count()
        if groups.processes > 1:
            _create_channels(groups, base)
        _channels[key] = (groups, base)
    return _channels[key]


def _create_channels(groups: AxisGroups, base: int) -> None:
    if world_size() != jax.process_count():
        raise RuntimeError(
            f"the ffi collectives need one MPI process per JAX process: MPI has {world_size()}, "
            f"JAX {jax.process_count()}; launch with mpiexec and start JAX from the MPI ranks "
            f"(jaxsmp.distributed.initialize does)")
    me = jax.process_index()
    for members in split_rounds(groups.channels):
        mine = [c for c in members if me in groups.channels[c]]
        cid, key = (base + mine[0], groups.channels[mine[0]].index(me)) if mine else (-1, 0)
        if (rc := _lib.jaxsmp_mpi_split(cid, key)) != 0:
            raise RuntimeError(f"MPI_Comm_split for channel {cid} failed (code {rc})")


def _check_platform() -> None:
    backend = jax.default_backend()
    if backend == "gpu" and NO_CUDA:
        raise NotImplementedError(f"the ffi collectives have no CUDA handlers here: {NO_CUDA}")
    if backend not in ("cpu", "gpu"):
        raise NotImplementedError(f"the MPI FFI collectives run on CPU and CUDA GPUs, not on "
                                  f"{backend!r}: use another algorithm")


def _varying_axes(x: jax.Array) -> set[str]:
    aval = jax.typeof(x)
    mat = getattr(aval, "manual_axis_type", None)  # jax >= 0.10; older: aval.vma
    return set(mat.varying) if mat is not None else set(getattr(aval, "vma", ()))


def _varying(out: jax.Array, x: jax.Array, axis_name: AxisName | None) -> jax.Array:
    """Type a result as varying over the axis (and whatever ``x`` varies over) inside
    shard_map, as XLA's own collectives' results are."""
    names = _varying_axes(x)
    names |= set(axis_names(axis_name))
    missing = tuple(sorted(names - _varying_axes(out)))
    return jax.lax.pcast(out, missing, to="varying") if missing else out


def _exchange(target: str, lead: jax.Array, rows: int, where: jax.Array,
              axis_name: AxisName | None, tag_site: tuple[int, str] | None = None) -> jax.Array:
    """The custom call: ``lead``'s rows exchanged within the channel ``where`` names.
    ``tag_site``: the call's tag, when it was taken in an enclosing trace (see _tag)."""
    _check_platform()
    tag, site = tag_site or _tag(target, axis_name, lead)
    out = jax.ShapeDtypeStruct((rows,) + lead.shape[1:], lead.dtype)
    result = jax.ffi.ffi_call(target, out)(
        lead, where, tag=np.int64(tag), timeout_ms=np.int64(timeout_seconds() * 1000), site=site)
    return _varying(result, lead, axis_name)


def _tag(target: str, axis_name: AxisName | None, x: jax.Array) -> tuple[int, str]:
    """Taken in the caller's trace, before any nested shard_map: a nested map traces afresh,
    so two equal calls from one line would count as first occurrences and share a tag,
    and XLA may run them at once on the same channel, crossing their messages."""
    return callsite.tag(target, axis_name, x.shape, x.dtype, _TAG_UB)


def _where(groups: AxisGroups, base: int, mesh: jax.sharding.Mesh) -> jax.Array:
    """(channel id, channel rank) of the device running this shard: all axes must be manual."""
    table = np.array([(c + base if c >= 0 else -1, b) for c, b in groups.where], np.int32)
    index = 0
    for name in mesh.axis_names:
        index = index * mesh.shape[name] + jax.lax.axis_index(name)
    return jnp.asarray(table)[index]


def _fully_manual(fn, x: jax.Array, mesh: jax.sharding.Mesh) -> jax.Array:
    """``fn(x)`` with every mesh axis manual: axes still automatic here (e.g. ``tp`` in
    jaxsmp's step) get a nested shard_map in which each of their devices runs ``fn`` on the
    whole value, over its own channel."""
    context = jax.sharding.get_abstract_mesh()
    if tuple(context.axis_names) != tuple(mesh.axis_names):
        raise ValueError(f"collectives.scope(mesh=...) has axes {mesh.axis_names} but the "
                         f"shard_map's mesh has {context.axis_names}")
    auto = {n for n in mesh.axis_names if n not in context.manual_axes}
    if not auto:
        return fn(x)
    return jax.shard_map(fn, in_specs=P(), out_specs=P(), axis_names=auto, check_vma=False)(x)


def _world_where(axis_name: AxisName | None) -> jax.Array:
    if axis_name is None:
        return jnp.full((2,), -1, jnp.int32)
    if (p := axis_size(axis_name)) != world_size():
        raise ValueError(f"without collectives.scope(mesh=...) the ffi collectives span "
                         f"MPI_COMM_WORLD ({world_size()} processes) but axis {axis_name!r} has "
                         f"{p} ranks: pass the mesh, or use one device per process")
    return jnp.stack([jnp.int32(-1), jax.lax.axis_index(axis_name).astype(jnp.int32)])


def _all_gather(x: jax.Array, axis_name: AxisName | None, axis: int, mesh) -> jax.Array:
    if mesh is None or axis_name is None:
        lead = jnp.moveaxis(x, axis, 0)
        rows = world_size() * lead.shape[0]
        out = _exchange(ALL_GATHER, lead, rows, _world_where(axis_name), axis_name)
        return jnp.moveaxis(out, 0, axis)
    groups, base = groups_for(mesh, axis_names(axis_name))
    if groups.processes == 1:  # the whole group is in this process
        return xla.all_gather(x, axis_name, axis)

    tag_site = _tag(ALL_GATHER, axis_name, x)

    def run(v):
        where = _where(groups, base, mesh)
        def across(shard):
            return _exchange(ALL_GATHER, shard[None], groups.processes, where, axis_name,
                             tag_site)
        return gather_two_level(v, axis_name, axis, groups.per_process, across)
    return _varying(_fully_manual(run, x, mesh), x, axis_name)  # a nested map drops types


def _reduce_scatter(x: jax.Array, axis_name: AxisName | None, axis: int, mesh) -> jax.Array:
    if mesh is None or axis_name is None:
        lead = jnp.moveaxis(x, axis, 0)
        rows, rem = divmod(lead.shape[0], world_size())
        if rem:
            raise ValueError(f"axis {axis} of shape {x.shape} is not divisible by "
                             f"{world_size()} ranks")
        out = _exchange(REDUCE_SCATTER, lead, rows, _world_where(axis_name), axis_name)
        return jnp.moveaxis(out, 0, axis)
    groups, base = groups_for(mesh, axis_names(axis_name))
    if groups.processes == 1:
        return xla.reduce_scatter(x, axis_name, axis)

    tag_site = _tag(REDUCE_SCATTER, axis_name, x)

    def run(v):
        where = _where(groups, base, mesh)
        def across(blocks):
            return _exchange(REDUCE_SCATTER, blocks, 1, where, axis_name, tag_site)[0]
        return scatter_two_level(v, axis_name, axis, groups.per_process, across)
    return _varying(_fully_manual(run, x, mesh), x, axis_name)  # a nested map drops types


_gather, _scatter = transpose_pair(_all_gather, _reduce_scatter)


def all_gather(x: jax.Array, axis_name: AxisName | None = None, axis: int = 0,
               mesh: jax.sharding.Mesh | None = None) -> jax.Array:
    """Tiled all-gather over ``axis_name`` (inside shard_map) of ``mesh`` (default: the
    mesh of :func:`collectives.scope`); None under plain jit in each process (the world)."""
    mesh = mesh if mesh is not None else current_scope().mesh
    return _gather(x, axis_name, axis % x.ndim, (mesh,))


def reduce_scatter(x: jax.Array, axis_name: AxisName | None = None, axis: int = 0,
                   mesh: jax.sharding.Mesh | None = None) -> jax.Array:
    """Tiled reduce-scatter (sum) over ``axis_name``; arguments as in :func:`all_gather`."""
    mesh = mesh if mesh is not None else current_scope().mesh
    return _scatter(x, axis_name, axis % x.ndim, (mesh,))
