"""ring / a2a / hierarchical / auto across 2 JAX processes x 4 CPU devices (gloo, localhost)."""
from pathlib import Path

import pytest

from collectives.timing import launch

WORKER = Path(__file__).with_name("multiprocess_worker.py")


def test_two_processes_of_four_devices_match_numpy_and_xla():
    outputs = launch(lambda i, port: [str(WORKER), str(i), "2", str(port)], 2, timeout=240)
    for i, out in enumerate(outputs):
        assert f"OK {i}" in out, out[-5000:]


@pytest.mark.slow
def test_four_processes_of_two_devices():
    outputs = launch(lambda i, port: [str(WORKER), str(i), "4", str(port), "2"], 4, timeout=480)
    for i, out in enumerate(outputs):
        assert f"OK {i}" in out, out[-5000:]
