"""Every test runs on 8 simulated CPU devices; set before JAX starts its backend.

YNNPACK fusions are turned off so that XLA:CPU's memory_analysis() counts every
buffer (they hide large ones otherwise). XLA:CPU aborts the process when a simulated
device reaches a collective a minute after the others (a 20 s warning, then its 40 s
rendezvous termination timeout); two test workers on two cores, one running an MPI job
that busy-polls, can starve a device that long, so the tests allow 10 minutes.
``collectives="auto"`` reads no calibration a developer cached on this machine (tests
that want one pass it), so tests see the same choices everywhere.

LLVM's optimizations are off (``--xla_backend_optimization_level=0``): the suite's time
is mostly XLA:CPU compiling small programs, and this cuts a full-step test's CPU time
by about 40% (54 to 33 s measured). It changes no HLO pass: the optimized HLO, buffer
assignment and ``memory_analysis()`` of a program compiled deviceless for H100 are
identical with and without it; CPU programs run slower, which tiny tests do not feel.

XLA:CPU's intra-op thread pool gets 8 threads per device (``jaxsmp.simulated_devices``
says why: with one per device a pipeline step could hang).
"""
import os

import pytest

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + " --xla_force_host_platform_device_count=8 --xla_cpu_experimental_ynn_fusion_type="
    + " --xla_cpu_collective_call_terminate_timeout_seconds=600"
    + " --xla_backend_optimization_level=0"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["JAXSMP_COLLECTIVES_PROFILE_DIR"] = os.path.join(
    os.path.dirname(__file__), ".no-collectives-calibration")  # never created
from jaxsmp.simulated_devices import set_pool_size  # after the variables above

set_pool_size(8)  # XLA:CPU's thread pool, for these processes and their children


@pytest.fixture
def triton_target_gpu(monkeypatch):
    """An H100 as the target GPU of Pallas Triton lowerings on this GPU-less host: JAX
    0.11.2 and later ask the local device (or an abstract mesh) for it while lowering a
    Triton kernel for CUDA, and fail without one; JAX 0.10 asks nothing."""
    try:
        from jax._src.pallas.triton import gpu_info
    except ImportError:
        return
    h100 = gpu_info.get_gpu_info_from_version(gpu_info.GpuVersion.H100)
    monkeypatch.setattr(gpu_info, "get_gpu_info", lambda: h100)
