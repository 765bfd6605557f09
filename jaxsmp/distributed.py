"""Multi-process start-up from the environment of common launchers.

Recognised, in order: jaxsmp's own launcher (``JAXSMP_COORDINATOR``,
``JAXSMP_NUM_PROCESSES``, ``JAXSMP_PROCESS_ID``), torchrun-style (``MASTER_ADDR``,
``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``), mpiexec/mpirun (Open MPI's
``OMPI_COMM_WORLD_RANK``/``_SIZE``, MPICH/Hydra's ``PMI_RANK``/``PMI_SIZE``), SageMaker
(``SM_HOSTS``, ``SM_CURRENT_HOST``) and SLURM (``SLURM_NTASKS`` > 1 in an ``srun`` step:
``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS``, the first host of ``SLURM_STEP_NODELIST``).

The coordinator's port is ``JAX_COORDINATOR_PORT`` when set. Otherwise: torchrun's
``MASTER_PORT`` + 1 (torchrun's own store listens on ``MASTER_PORT``), SLURM's ``MASTER_PORT``
or JAX's port for the job id (61440 + ``SLURM_JOB_ID`` mod 4096). Process 0 checks the port is
free before JAX binds it. Every process then joins with JAX's own cluster detection off:
each uses all the devices it sees (JAX's SLURM detection would keep only device
``SLURM_LOCALID``, one GPU of a one-task-per-node job); give tasks that share a node their own
GPUs (``srun --gpus-per-task``), or it is an error.

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
import math
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

import jax

from collectives.ffi.mpi_env import MpiLaunch, env_int, mpi_launch

DEFAULT_PORT = 12355
# how each launcher's coordinator port is chosen, for the error when it is taken
PORT_RULES = {"torchrun": "torchrun's MASTER_PORT + 1", "slurm": "MASTER_PORT, else 61440 + "
              "SLURM_JOB_ID mod 4096", "sagemaker": "MASTER_PORT, else 12355",
              "jaxsmp.launch": "JAXSMP_COORDINATOR"}


class LaunchError(RuntimeError):
    """The launch cannot form one JAX job (e.g. the coordinator's port is taken)."""


@dataclass(frozen=True)
class ClusterSpec:
    """Where the coordinator is, how many processes there are, which one this is.
    ``coordinator=None`` (an MPI launch) means rank 0 broadcasts it over MPI when the
    processes start (:func:`initialize`)."""
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


def _torchrun(env: Mapping[str, str]) -> ClusterSpec:
    """torchrun's own store listens on MASTER_PORT (TORCHELASTIC_* set): JAX takes the next."""
    port = env_int(env, "MASTER_PORT") if "MASTER_PORT" in env else DEFAULT_PORT
    if "TORCHELASTIC_RUN_ID" in env:
        port += 1
    port = env.get("JAX_COORDINATOR_PORT", port)
    return ClusterSpec("torchrun", f"{env.get('MASTER_ADDR', '127.0.0.1')}:{port}",
                       env_int(env, "WORLD_SIZE"), env_int(env, "RANK"))


def _first_host(nodelist: str) -> str:
    """The first host of a SLURM host list: 'gpu[003-010,12],cpu1' -> 'gpu003'."""
    m = re.match(r"([^,\[]+)(?:\[([^\]\-,]+))?", nodelist)
    if m is None:
        raise ValueError(f"SLURM_STEP_NODELIST={nodelist!r} is not a SLURM host list")
    return m[1] + (m[2] or "")


def _tasks_per_node(env: Mapping[str, str]) -> list[int]:
    """SLURM_STEP_TASKS_PER_NODE expanded: '2(x3),1' -> [2, 2, 2, 1]."""
    counts = []
    for part in env.get("SLURM_STEP_TASKS_PER_NODE", "1").split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if m is None:
            raise ValueError(f"SLURM_STEP_TASKS_PER_NODE={env['SLURM_STEP_TASKS_PER_NODE']!r} "
                             "is not a SLURM task count list")
        counts += [int(m[1])] * int(m[2] or 1)
    return counts


def _check_own_gpus(env: Mapping[str, str]) -> None:
    """Tasks that share a node must not all see every GPU the step has there."""
    node = env_int(env, "SLURM_NODEID") if "SLURM_NODEID" in env else 0
    tasks = _tasks_per_node(env)[node]
    step_gpus = [g for g in env.get("SLURM_STEP_GPUS", env.get("SLURM_JOB_GPUS", "")).split(",")
                 if g]
    visible = env.get("CUDA_VISIBLE_DEVICES")
    seen = step_gpus if visible is None else [g for g in visible.split(",") if g]
    if tasks > 1 and step_gpus and len(seen) >= len(step_gpus):
        raise ValueError(
            f"{tasks} tasks of this SLURM step run on node {env.get('SLURMD_NODENAME', node)} "
            f"and each asks for the same GPUs (CUDA_VISIBLE_DEVICES={visible}, all of the "
            f"step's SLURM_STEP_GPUS={','.join(step_gpus)}): give each task its own with "
            f"srun --gpus-per-task={max(1, len(step_gpus) // tasks)}, or run one task per node "
            "(--ntasks-per-node=1) that uses them all")


def _slurm(env: Mapping[str, str]) -> ClusterSpec:
    """An srun task: the coordinator on the step's first host, JAX's port for the job id."""
    if "SLURM_STEP_ID" not in env:
        raise ValueError(
            f"SLURM_NTASKS={env['SLURM_NTASKS']} but this process is not an srun task (no "
            "SLURM_STEP_ID: the batch script itself?); start one trainer per task with "
            "`srun python -m jaxsmp.train ...`")
    _check_own_gpus(env)
    port = env.get("JAX_COORDINATOR_PORT",
                   env.get("MASTER_PORT", env_int(env, "SLURM_JOB_ID") % 4096 + 61440))
    tasks = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
    return ClusterSpec("slurm", f"{_first_host(env['SLURM_STEP_NODELIST'])}:{port}",
                       env_int(env, tasks), env_int(env, "SLURM_PROCID"))


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
        return None if env_int(env, "WORLD_SIZE") == 1 else _torchrun(env)
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
        return _slurm(env)
    return None


def _check_port_free(spec: ClusterSpec) -> None:
    """On process 0, where JAX will serve the coordinator: a clear error if the port is taken
    (JAX's own is 'Failed to start RPC server')."""
    port = int(spec.coordinator.rsplit(":", 1)[1])
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC: TIME_WAIT is fine
        try:
            s.bind(("", port))
        except OSError as e:
            rule = PORT_RULES.get(spec.source, "broadcast over MPI, or MASTER_PORT")
            raise LaunchError(
                f"the JAX coordinator port {port} (from {spec.source}: {rule}) is in use on this "
                f"host ({e.strerror}): another job or a leftover process holds it; choose a "
                f"free port with JAX_COORDINATOR_PORT") from None


def check_mesh_fits(spec: ClusterSpec | None, degrees: Mapping[str, int | None]) -> None:
    """A clear error, naming the launch, when its processes' devices cannot form the mesh
    (``degrees``: dp, sdp, ... with ``sdp=None`` taking the devices left over)."""
    if spec is None:
        return
    local, count = jax.local_device_count(), jax.device_count()
    fixed = math.prod(v for v in degrees.values() if v is not None)
    if (count % fixed == 0) if degrees.get("sdp") is None else (fixed == count):
        return
    mesh = " x ".join(f"{k}={v}" for k, v in degrees.items() if v not in (None, 1)) or "dp=1"
    need = f"{fixed}" if degrees.get("sdp") is not None else f"a multiple of {fixed}"
    tasks = f"{fixed // local} processes" if fixed % local == 0 else "a different mesh"
    launch = {"slurm": f"sbatch --ntasks={fixed // local}", "torchrun":
              "--nnodes x --nproc_per_node"}.get(spec.source, "the launcher's process count")
    raise ValueError(
        f"{spec.source} started {spec.num_processes} processes with {local} devices each "
        f"({count} devices), but the mesh {mesh} needs {need} devices: start {tasks} "
        f"({launch}) or change the mesh")


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
    if spec.process_id == 0:
        _check_port_free(spec)
    if os.environ.get("JAX_PLATFORMS", "") == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(  # detection off: no device_ids=[SLURM_LOCALID] (see above)
        spec.coordinator, spec.num_processes, spec.process_id,
        cluster_detection_method="deactivate", initialization_timeout=initialization_timeout,
        heartbeat_timeout_seconds=heartbeat_timeout)
    return spec
