"""The sdp gather / reduce-scatter runs through every collectives algorithm, bucketed
or per parameter, and gives the gradients (within 1e-5 of each parameter's largest,
grad_norm rtol 1e-5) and training losses (rtol 1e-5) of XLA's own collectives;
``ffi`` under mpiexec, through the API and the trainer."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import jaxsmp
from collectives.ffi.build import find_mpiexec
from conftest import assert_gradients_match, gradients, train

ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def xla_losses(tiny_config, tokens):
    return train(tiny_config, jaxsmp.Mesh(dp=2, sdp=4, collectives="xla"), tokens,
                 bucket=False)[1]


@pytest.fixture(scope="module")
def xla_gradients(tiny_config, tokens):
    return gradients(tiny_config, jaxsmp.Mesh(dp=2, sdp=4, collectives="xla"), tokens,
                     bucket=False)


@pytest.mark.parametrize("algorithm, bucket", [
    ("xla", True), ("ring", False), ("a2a", True), ("hierarchical", True), ("auto", True)])
def test_algorithms_give_xla_gradients_and_losses(tiny_config, tokens, xla_gradients,
                                                   xla_losses, algorithm, bucket):
    mesh = jaxsmp.Mesh(dp=2, sdp=4, collectives=algorithm)
    assert_gradients_match(gradients(tiny_config, mesh, tokens, bucket=bucket), xla_gradients)
    _, losses = train(tiny_config, mesh, tokens, bucket=bucket)
    np.testing.assert_allclose(losses, xla_losses, rtol=1e-5)


def test_step_option_overrides_the_mesh(tiny_config, tokens, xla_losses):
    _, losses = train(tiny_config, jaxsmp.Mesh(dp=2, sdp=4), tokens, collectives="ring")
    np.testing.assert_allclose(losses, xla_losses, rtol=1e-5)


def test_unknown_algorithm_is_refused_by_the_mesh():
    with pytest.raises(ValueError, match=r"unknown collectives algorithm 'fast'; valid: \["):
        jaxsmp.Mesh(sdp=8, collectives="fast")


def _mpiexec(n: int, devices: int, *command: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MASTER_", "XLA_FLAGS"))}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    run = subprocess.run([find_mpiexec(), "-n", str(n), sys.executable, *command],
                         capture_output=True, text=True, timeout=900, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout


needs_mpiexec = pytest.mark.skipif(find_mpiexec() is None,
                                   reason="no mpiexec: pip install 'jaxsmp[mpi]'")


@needs_mpiexec
@pytest.mark.slow
@pytest.mark.parametrize("processes, devices, meshes", [
    (4, 1, ["dp=2,sdp=2", "sdp=2,tp=2"]),
    (2, 2, ["sdp=4"]),  # two devices of an sdp group per process
])
def test_ffi_trains_like_xla_under_mpiexec_through_the_api(processes, devices, meshes):
    out = _mpiexec(processes, devices, str(ROOT / "tests" / "jaxsmp" / "mpi_train_worker.py"),
                   *meshes)
    assert sorted(re.findall(r"OK (\d+)", out)) == [str(i) for i in range(processes)]


@needs_mpiexec
@pytest.mark.slow
def test_the_trainer_with_ffi_under_mpiexec_has_the_losses_of_xla():
    """4 processes (dp=2 x sdp=2, ffi) against one process of 4 devices with xla (the
    launcher test shows one process and several give the same losses)."""
    flags = ["--dp", "2", "--sdp", "2", "--steps", "3", "--eval-every", "0", "--no-progress",
             "--print-losses", "--seq-len", "32", "--batch-size", "8"]
    script = str(ROOT / "examples" / "train_gpt_neox.py")
    ffi = _mpiexec(4, 1, script, *flags, "--collectives", "ffi")
    xla = subprocess.run([sys.executable, script, *flags, "--collectives", "xla",
                          "--simulate-devices", "4"], capture_output=True, text=True,
                         timeout=600, check=True).stdout
    np.testing.assert_allclose(_losses(ffi), _losses(xla), rtol=1e-5)


def _losses(out: str) -> list[float]:
    return json.loads(next(l for l in out.splitlines() if "losses: " in l).split(": ", 1)[1])
