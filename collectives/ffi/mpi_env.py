"""Whether this process is one rank of an MPI job, from the launcher's environment, and
whether the ``ffi`` algorithm can serve a mesh axis here."""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

# launcher -> (rank, size, ranks on this node) variables
LAUNCHERS = {
    "openmpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    "mpich": ("PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS"),  # Hydra (MPICH, Intel MPI)
}


@dataclass(frozen=True)
class MpiLaunch:
    launcher: str
    rank: int
    size: int
    local_size: int | None  # ranks on this node, if the launcher says

    @property
    def single_node(self) -> bool:
        return self.local_size == self.size


def env_int(env: Mapping[str, str], key: str) -> int:
    """``env[key]`` as an integer, or an error naming the variable and its value."""
    try:
        return int(env[key])
    except ValueError:
        raise ValueError(f"environment variable {key}={env[key]!r} is not an integer") from None


def mpi_launch(env: Mapping[str, str] | None = None) -> MpiLaunch | None:
    """The MPI job this process was started in by mpiexec/mpirun, or None."""
    env = os.environ if env is None else env
    for launcher, (rank, size, local) in LAUNCHERS.items():
        if rank in env and size in env:
            local_size = env_int(env, local) if local in env else None
            return MpiLaunch(launcher, env_int(env, rank), env_int(env, size), local_size)
    return None


def usable(mesh, names: tuple[str, ...]) -> tuple[bool, str]:
    """(can ``ffi`` run a collective over axis ``names`` of ``mesh`` here, why or why not).
    Builds and loads the library only when everything else allows it."""
    import jax

    from collectives.ffi.groups import axis_groups
    if mesh is None:
        return False, "no mesh in collectives.scope(mesh=...): ffi needs the axis's MPI groups"
    launch = mpi_launch()
    if launch is None or launch.size == 1:
        return False, "not an MPI job of several processes (launch with mpiexec/mpirun)"
    if jax.process_count() != launch.size:
        return False, f"JAX has {jax.process_count()} processes but MPI {launch.size}"
    try:
        groups = axis_groups(mesh.devices, mesh.axis_names, names)
    except ValueError as e:
        return False, str(e)
    if groups.processes == 1:
        return False, f"every group of axis {names} lives in one process"
    if jax.default_backend() not in ("cpu", "gpu"):
        return False, f"no ffi handlers for backend {jax.default_backend()!r}"
    from collectives.ffi.build import BuildError
    try:
        from collectives.ffi import ops  # compiles on first use
    except BuildError as e:
        return False, f"the MPI library did not build: {str(e).splitlines()[0]}"
    if jax.default_backend() == "gpu" and ops.NO_CUDA:
        return False, f"no CUDA handlers: {ops.NO_CUDA}"
    return True, (f"MPI job of {launch.size} processes; groups of {groups.processes} processes "
                  f"x {groups.per_process} devices")
