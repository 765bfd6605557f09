"""Multi-process jaxsmp: launcher environments, the local launcher, hybrid sharding
across 2 processes x 4 devices matching the single-process run."""
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxsmp.distributed import ClusterSpec, cluster_from_env

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize("env, expected", [
    ({"JAXSMP_COORDINATOR": "h:1", "JAXSMP_NUM_PROCESSES": "2", "JAXSMP_PROCESS_ID": "1"},
     ClusterSpec("jaxsmp.launch", "h:1", 2, 1)),
    ({"MASTER_ADDR": "n0", "MASTER_PORT": "29500", "RANK": "3", "WORLD_SIZE": "4"},
     ClusterSpec("torchrun", "n0:29500", 4, 3)),
    ({"SM_HOSTS": '["algo-2", "algo-1"]', "SM_CURRENT_HOST": "algo-2"},
     ClusterSpec("sagemaker", "algo-1:12355", 2, 1)),
    ({"SLURM_NTASKS": "16"}, ClusterSpec("slurm", None, None, None)),
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


def test_a_dead_process_stops_the_others_quickly():
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "jaxsmp.launch", "--hosts", "2", "--devices-per-host", "1",
         "--timeout", "120", str(ROOT / "tests" / "jaxsmp" / "dead_worker.py")],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 3
    assert "process 1 exited with code 3" in proc.stderr
    assert time.monotonic() - start < 60
