"""Multi-process jaxsmp: launcher environments, the local launcher, hybrid sharding
across 2 processes x 4 devices matching the single-process run."""
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collectives.ffi.build import find_mpiexec
from collectives.ffi.mpi_env import mpi_launch
from jaxsmp.distributed import (
    ClusterSpec,
    LaunchError,
    _broadcast_coordinator,
    cluster_from_env,
    initialize,
)

ROOT = Path(__file__).parents[2]


# what srun gives task 1 of 16 on 16 nodes: one task per node, each all of its node's GPUs
SRUN_TASK_1 = {"SLURM_JOB_ID": "4118", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "16",
               "SLURM_STEP_NUM_TASKS": "16", "SLURM_PROCID": "1", "SLURM_NODEID": "1",
               "SLURM_STEP_NODELIST": "gpu[003-010,012-019]", "SLURM_STEP_TASKS_PER_NODE":
               "1(x16)", "SLURM_STEP_GPUS": "0,1,2,3,4,5,6,7",
               "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}


@pytest.mark.parametrize("env, expected", [
    ({"JAXSMP_COORDINATOR": "h:1", "JAXSMP_NUM_PROCESSES": "2", "JAXSMP_PROCESS_ID": "1"},
     ClusterSpec("jaxsmp.launch", "h:1", 2, 1)),
    ({"MASTER_ADDR": "n0", "MASTER_PORT": "29500", "RANK": "3", "WORLD_SIZE": "4"},
     ClusterSpec("torchrun", "n0:29500", 4, 3)),
    ({"SM_HOSTS": '["algo-2", "algo-1"]', "SM_CURRENT_HOST": "algo-2"},
     ClusterSpec("sagemaker", "algo-1:12355", 2, 1)),
    ({"MASTER_ADDR": "localhost", "MASTER_PORT": "29500", "RANK": "1", "WORLD_SIZE": "2",
      "TORCHELASTIC_RUN_ID": "x"}, ClusterSpec("torchrun", "localhost:29501", 2, 1)),
    ({**SRUN_TASK_1}, ClusterSpec("slurm", "gpu003:61462", 16, 1)),  # 61440 + 4118 % 4096
    ({**SRUN_TASK_1, "MASTER_PORT": "4000"}, ClusterSpec("slurm", "gpu003:4000", 16, 1)),
    ({**SRUN_TASK_1, "JAX_COORDINATOR_PORT": "4001", "MASTER_PORT": "4000"},
     ClusterSpec("slurm", "gpu003:4001", 16, 1)),
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


def test_the_first_host_of_a_slurm_host_list():
    from jaxsmp.distributed import _first_host
    assert _first_host("node001") == "node001"
    assert _first_host("node001,host2") == "node001"
    assert _first_host("gpu[003-010,12],cpu1") == "gpu003"
    assert _first_host("a-b[7,9]") == "a-b7"


def test_a_slurm_batch_script_that_runs_the_trainer_without_srun_is_an_error():
    batch = {k: v for k, v in SRUN_TASK_1.items() if k != "SLURM_STEP_ID"}
    with pytest.raises(ValueError, match=r"SLURM_NTASKS=16 but this process is not an srun task "
                                         r".*`srun python -m jaxsmp.train ...`"):
        cluster_from_env(batch)


def test_slurm_tasks_sharing_a_node_must_not_ask_for_the_same_gpus():
    two_per_node = {**SRUN_TASK_1, "SLURM_STEP_TASKS_PER_NODE": "2(x8)", "SLURMD_NODENAME": "gpu004"}
    with pytest.raises(ValueError, match=r"2 tasks of this SLURM step run on node gpu004 and each "
                                         r"asks for the same GPUs \(CUDA_VISIBLE_DEVICES=0,1,2,3,"
                                         r"4,5,6,7.*srun --gpus-per-task=4"):
        cluster_from_env(two_per_node)
    with pytest.raises(ValueError, match="each asks for the same GPUs"):  # SLURM set none
        cluster_from_env({k: v for k, v in two_per_node.items() if k != "CUDA_VISIBLE_DEVICES"})
    own = {**two_per_node, "CUDA_VISIBLE_DEVICES": "4,5,6,7"}  # srun --gpus-per-task=4
    assert cluster_from_env(own) == ClusterSpec("slurm", "gpu003:61462", 16, 1)
    last_node_alone = {**two_per_node, "SLURM_STEP_TASKS_PER_NODE": "2(x7),1", "SLURM_NODEID": "7"}
    assert cluster_from_env(last_node_alone).process_id == 1


def _listening_socket() -> socket.socket:
    s = socket.socket()
    s.bind(("", 0))
    s.listen()
    return s


def test_a_coordinator_port_in_use_is_a_clear_error():
    with _listening_socket() as taken:
        port = taken.getsockname()[1]
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port - 1), "RANK": "0",
               "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x"}
        with pytest.raises(LaunchError, match=rf"the JAX coordinator port {port} \(from torchrun: "
                                              r"torchrun's MASTER_PORT \+ 1\) is in use on this "
                                              r"host .*choose a free port with JAX_COORDINATOR_PORT"):
            initialize(env)  # before JAX binds it, so this process can still start JAX


def test_the_trainer_exits_with_the_port_error_not_a_traceback():
    with _listening_socket() as taken:
        env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "JAX_COORDINATOR_PORT": str(taken.getsockname()[1])}
        run = subprocess.run([sys.executable, "-m", "jaxsmp.train", "--steps", "1"], env=env,
                             capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr[-3000:]
    assert "error: the JAX coordinator port" in run.stderr and "Traceback" not in run.stderr


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


@pytest.mark.slow
def test_a_process_late_to_its_first_step_is_waited_for():
    """Process 1 starts its first step 40 s after process 0 (``late_worker.py``): past
    gloo's fixed 30 s rendezvous, which failed the run (``Gloo context initialization
    failed: DEADLINE_EXCEEDED``) before the step met at a barrier first
    (``jaxsmp/train/first_run.py``)."""
    proc = subprocess.run(
        [sys.executable, "-m", "jaxsmp.launch", "--hosts", "2", "--devices-per-host", "2",
         "--timeout", "400", str(ROOT / "tests" / "jaxsmp" / "late_worker.py")],
        capture_output=True, text=True, timeout=460)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    losses = _losses(proc.stdout)
    assert len(losses) == 2 and all(0 < loss < 10 for loss in losses), losses


@pytest.mark.slow
def test_processes_agree_whether_a_checkpoint_directory_exists(tmp_path):
    """Process 0 creates the directory between its look and process 1's
    (``checkpoint_dir_worker.py``): each looking for itself, process 1 opened orbax's
    store (a collective) alone and the run hung, as the trainer did when its config
    landed in the checkpoint directory first."""
    proc = subprocess.run(
        [sys.executable, "-m", "jaxsmp.launch", "--hosts", "2", "--devices-per-host", "1",
         "--timeout", "200", str(ROOT / "tests" / "jaxsmp" / "checkpoint_dir_worker.py"),
         str(tmp_path / "ckpt")], capture_output=True, text=True, timeout=260)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "process 0 found steps []" in proc.stdout
    assert "process 1 found steps []" in proc.stdout
