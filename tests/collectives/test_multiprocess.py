"""ring / a2a / hierarchical / auto across 2 JAX processes x 4 CPU devices (gloo, localhost)."""
import os
import socket
import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).with_name("multiprocess_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_processes(n: int, timeout: float = 240) -> list[str]:
    port = str(_free_port())
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(i), str(n), port], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(n)]
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=timeout)
            outputs.append(out)
            assert proc.returncode == 0, out[-5000:]
    finally:
        for proc in procs:  # never leave a peer waiting on a dead coordinator
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return outputs


def test_two_processes_of_four_devices_match_numpy_and_xla():
    outputs = _run_processes(2)
    for i, out in enumerate(outputs):
        assert f"OK {i}" in out, out[-5000:]
