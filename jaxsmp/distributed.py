"""Multi-process start-up from the environment of common launchers.

Recognised, in order: jaxsmp's own launcher (``JAXSMP_COORDINATOR``,
``JAXSMP_NUM_PROCESSES``, ``JAXSMP_PROCESS_ID``), torchrun-style (``MASTER_ADDR``,
``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``), mpiexec/mpirun (Open MPI's
``OMPI_COMM_WORLD_RANK``/``_SIZE``, MPICH/Hydra's ``PMI_RANK``/``PMI_SIZE``), SageMaker
(``SM_HOSTS``, ``SM_CURRENT_HOST``) and SLURM (``SLURM_NTASKS`` > 1, detected by JAX itself).

Under MPI the coordinator is ``MASTER_ADDR:MASTER_PORT`` when set (port default 12355);
otherwise rank 0 picks a free port and broadcasts its address over MPI (127.0.0.1 when the
launcher says every rank is on this node, else its outward address); without a loadable MPI
library that works only on one node (127.0.0.1:12355), and across nodes it is an error asking
for ``MASTER_ADDR``. A process that stops sending heartbeats fails the others after
``heartbeat_timeout`` seconds instead of hanging them.
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
from dataclasses import dataclass
from typing import Mapping

import jax

from collectives.ffi.mpi_env import MpiLaunch, env_int, mpi_launch

DEFAULT_PORT = 12355


@dataclass(frozen=True)
class ClusterSpec:
    """Where the coordinator is, how many processes there are, which one this is.
    ``coordinator=None`` lets JAX detect the cluster (SLURM), or, for an MPI launch, means
    rank 0 broadcasts it over MPI when the processes start (:func:`initialize`)."""
    source: str
    coordinator: str | None
    num_processes: int | None
    process_id: int | None


def _sagemaker(env: Mapping[str, str]) -> ClusterSpec:
    hosts = json.loads(env["SM_HOSTS"])
    current = env["SM_CURRENT_HOST"]
    if current not in hosts:
        raise ValueError(f"SM_CURRENT_HOST={current!r} is not in SM_HOSTS={hosts}")
    port = env.get("MASTER_PORT", str(DEFAULT_PORT))
    return ClusterSpec("sagemaker", f"{sorted(hosts)[0]}:{port}", len(hosts),
                       sorted(hosts).index(current))


def _mpi_coordinator(env: Mapping[str, str], launch: MpiLaunch) -> str | None:
    """MASTER_ADDR:MASTER_PORT when given; else None: formed over MPI at start-up."""
    if "MASTER_ADDR" in env:
        return f"{env['MASTER_ADDR']}:{env.get('MASTER_PORT', DEFAULT_PORT)}"
    if launch.single_node and "MASTER_PORT" in env:
        return f"127.0.0.1:{env['MASTER_PORT']}"
    return None


def _outward_address() -> str:
    """This host's address on the interface that routes off the host (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            return s.getsockname()[0]
        except OSError:
            return socket.gethostbyname(socket.gethostname())


def _broadcast_coordinator(spec: ClusterSpec, launch: MpiLaunch) -> str:
    """Rank 0's address and a free port, broadcast over MPI to every rank."""
    try:
        from collectives.ffi import ops  # builds (once) and loads the MPI library
    except Exception as e:  # no compiler, no MPI headers, a failed build or MPI_Init
        if launch.single_node:
            return f"127.0.0.1:{DEFAULT_PORT}"
        raise RuntimeError(
            f"{spec.num_processes} processes were started by {launch.launcher} across nodes, "
            f"but no JAX coordinator can be formed: set MASTER_ADDR (rank 0's host) and "
            f"MASTER_PORT, or install an MPI library jaxsmp can build against "
            f"(pip install 'jaxsmp[mpi]' or MPI_HOME) to broadcast it ({e})") from e
    if ops.world_size() != spec.num_processes:
        raise RuntimeError(f"{launch.launcher} says {spec.num_processes} processes but MPI "
                           f"has {ops.world_size()}: is the MPI library the launcher's?")
    address = ""
    if launch.rank == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        address = f"{'127.0.0.1' if launch.single_node else _outward_address()}:{port}"
    return ops.broadcast(address.encode(), 256).rstrip(b"\0").decode()


def cluster_from_env(env: Mapping[str, str] | None = None) -> ClusterSpec | None:
    """The cluster this process belongs to, or ``None`` for a single process."""
    env = os.environ if env is None else env
    if "JAXSMP_COORDINATOR" in env:
        return ClusterSpec("jaxsmp.launch", env["JAXSMP_COORDINATOR"],
                           env_int(env, "JAXSMP_NUM_PROCESSES"),
                           env_int(env, "JAXSMP_PROCESS_ID"))
    if "WORLD_SIZE" in env and "RANK" in env:
        if env_int(env, "WORLD_SIZE") == 1:
            return None
        address = f"{env.get('MASTER_ADDR', '127.0.0.1')}:{env.get('MASTER_PORT', DEFAULT_PORT)}"
        return ClusterSpec("torchrun", address, env_int(env, "WORLD_SIZE"),
                           env_int(env, "RANK"))
    launch = mpi_launch(env)
    if launch is not None:
        if launch.size == 1:
            return None
        return ClusterSpec(launch.launcher, _mpi_coordinator(env, launch), launch.size,
                           launch.rank)
    if "SM_HOSTS" in env and "SM_CURRENT_HOST" in env:
        spec = _sagemaker(env)
        return spec if spec.num_processes > 1 else None
    if "SLURM_NTASKS" in env and env_int(env, "SLURM_NTASKS") > 1:
        return ClusterSpec("slurm", None, None, None)
    return None


def initialize(env: Mapping[str, str] | None = None, *, heartbeat_timeout: int = 30,
               initialization_timeout: int = 120) -> ClusterSpec | None:
    """Starts JAX's distributed runtime if the environment describes several processes.

    On CPU the gloo collectives carry cross-process traffic. Returns the spec used.
    """
    spec = cluster_from_env(env)
    if spec is None:
        return None
    launch = mpi_launch(os.environ if env is None else env)
    if launch is not None and spec.coordinator is None:
        spec = dataclasses.replace(spec, coordinator=_broadcast_coordinator(spec, launch))
    if os.environ.get("JAX_PLATFORMS", "") == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        spec.coordinator, spec.num_processes, spec.process_id,
        initialization_timeout=initialization_timeout,
        heartbeat_timeout_seconds=heartbeat_timeout)
    return spec
