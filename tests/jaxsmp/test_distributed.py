"""Multi-process jaxsmp: launcher environments, the local launcher, hybrid sharding
across 2 processes x 4 devices matching the single-process run."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collectives.ffi.build import find_mpiexec
from collectives.ffi.mpi_env import mpi_launch
from jaxsmp.distributed import ClusterSpec, _broadcast_coordinator, cluster_from_env, initialize

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize("env, expected", [
    ({"JAXSMP_COORDINATOR": "h:1", "JAXSMP_NUM_PROCESSES": "2", "JAXSMP_PROCESS_ID": "1"},
     ClusterSpec("jaxsmp.launch", "h:1", 2, 1)),
    ({"MASTER_ADDR": "n0", "MASTER_PORT": "29500", "RANK": "3", "WORLD_SIZE": "4"},
     ClusterSpec("torchrun", "n0:29500", 4, 3)),
    ({"SM_HOSTS": '["algo-2", "algo-1"]', "SM_CURRENT_HOST": "algo-2"},
     ClusterSpec("sagemaker", "algo-1:12355", 2, 1)),
    ({"SLURM_NTASKS": "16"}, ClusterSpec("slurm", None, None, None)),
    ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALNRANKS": "2", "MASTER_PORT": "4000"},
     ClusterSpec("mpich", "127.0.0.1:4000", 2, 1)),
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "MASTER_ADDR": "n0"},
     ClusterSpec("openmpi", "n0:12355", 4, 3)),
    # no MASTER_*: rank 0 broadcasts its address over MPI when the processes start
    ({"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALNRANKS": "1"}, ClusterSpec("mpich", None, 2, 0)),
    ({"PMI_RANK": "0", "PMI_SIZE": "1", "SLURM_NTASKS": "1"}, None),
    ({"RANK": "0", "WORLD_SIZE": "1"}, None),
    ({}, None),
])
def test_cluster_from_launcher_environments(env, expected):
    assert cluster_from_env(env) == expected


def test_bad_environment_names_the_variable():
    with pytest.raises(ValueError, match=r"WORLD_SIZE='four'"):
        cluster_from_env({"RANK": "0", "WORLD_SIZE": "four"})
    with pytest.raises(ValueError, match=r"SM_CURRENT_HOST='x' is not in SM_HOSTS"):
        cluster_from_env({"SM_HOSTS": '["a"]', "SM_CURRENT_HOST": "x"})
    with pytest.raises(ValueError, match=r"OMPI_COMM_WORLD_SIZE='n' is not an integer"):
        cluster_from_env({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "n"})


def test_an_mpi_launch_across_nodes_without_mpi_or_master_addr_is_an_error(monkeypatch):
    import collectives.ffi
    monkeypatch.delattr(collectives.ffi, "ops", raising=False)  # imported by another test
    monkeypatch.setitem(sys.modules, "collectives.ffi.ops", None)  # the library cannot load
    env = {"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALNRANKS": "1"}
    with pytest.raises(RuntimeError, match="2 processes were started by mpich across nodes, "
                                           "but no JAX coordinator can be formed: set MASTER_ADDR"):
        initialize(env)
    single_node = {"PMI_RANK": "0", "PMI_SIZE": "2", "MPI_LOCALNRANKS": "2"}
    assert _broadcast_coordinator(cluster_from_env(single_node), mpi_launch(single_node)) == (
        "127.0.0.1:12355")


def _losses(output: str) -> list[float]:
    line = next(l for l in output.splitlines() if "losses: " in l)
    return json.loads(line.split("losses: ")[1])


def test_two_processes_match_one_process_with_hybrid_sharding(prepared_dir):
    """Each process reads only its rows of the memory-mapped dataset."""
    args = ["--dp", "2", "--sdp", "4", "--steps", "4", "--eval-every", "0", "--no-progress",
            "--print-losses", "--seq-len", "32", "--batch-size", "16", "--log-all-processes",
            "--data", str(prepared_dir)]
    script = str(ROOT / "examples" / "train_gpt_neox.py")
    single = subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                            timeout=600, check=True).stdout
    multi = subprocess.run(
        [sys.executable, "-m", "jaxsmp.launch", "--hosts", "2", "--devices-per-host", "4",
         "--timeout", "600", script, *args], capture_output=True, text=True, timeout=660)
    assert multi.returncode == 0, multi.stdout[-3000:] + multi.stderr[-3000:]
    assert "[1] " in multi.stdout  # both processes ran; process 0 prints the losses
    assert _losses(multi.stdout) == pytest.approx(_losses(single), rel=1e-5)


def _trainer(*args: str, env: dict | None = None, mpi: int = 0) -> str:
    script = str(ROOT / "examples" / "train_gpt_neox.py")
    flags = ["--steps", "3", "--eval-every", "0", "--no-progress", "--print-losses",
             "--seq-len", "32", "--batch-size", "8", *args]
    command = [sys.executable, script, *flags]
    if mpi:
        command = [find_mpiexec(), "-n", str(mpi), *command]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout


@pytest.mark.skipif(find_mpiexec() is None, reason="no mpiexec: pip install 'jaxsmp[mpi]'")
@pytest.mark.slow
def test_mpiexec_forms_one_job_with_the_losses_of_one_process():
    """mpiexec -n 2 with 2 CPU devices per process (no MASTER_ADDR: rank 0 broadcasts its
    address over MPI) trains like one process of 4 devices on the same global mesh."""
    mesh = ["--dp", "2", "--sdp", "2"]
    single = _trainer(*mesh, "--simulate-devices", "4")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "XLA_FLAGS"))}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
    multi = _trainer(*mesh, env=env, mpi=2)
    assert multi.count("losses: ") == 1  # process 0 prints; two silent copies would print twice
    assert _losses(multi) == pytest.approx(_losses(single), rel=1e-5)


def test_a_dead_process_stops_the_others_quickly():
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "jaxsmp.launch", "--hosts", "2", "--devices-per-host", "1",
         "--timeout", "120", str(ROOT / "tests" / "jaxsmp" / "dead_worker.py")],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 3
    assert "process 1 exited with code 3" in proc.stderr
    assert time.monotonic() - start < 60
