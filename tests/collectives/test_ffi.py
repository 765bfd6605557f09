"""The MPI FFI custom call: built with g++ (and nvcc for the CUDA handlers), run under mpiexec
(mpich wheel): the world, sdp groups of real meshes, several devices per process, tags and
the wait timeout."""
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from collectives.ffi import build
from collectives.timing import free_port

WORKER = Path(__file__).with_name("mpi_worker.py")
GROUPS_WORKER = Path(__file__).with_name("mpi_groups_worker.py")
MPIEXEC = build.find_mpiexec()


def _have_mpich() -> bool:
    try:
        build.find_mpi()
    except build.BuildError:
        return False
    return MPIEXEC is not None


needs_mpi = pytest.mark.skipif(not _have_mpich(),
                               reason="mpich not installed: pip install 'jaxsmp[mpi]' (mpich wheel)")


def _mpiexec(*args: str, n: int = 4, worker: Path = WORKER) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    run = subprocess.run([MPIEXEC, "-n", str(n), sys.executable, str(worker), *args],
                         capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def _ok_ranks(out: str) -> list[int]:
    return sorted(int(r) for r in re.findall(r"OK (\d+)", out))  # ranks' lines may interleave


@needs_mpi
def test_mpiexec_jit_matches_numpy():
    assert _ok_ranks(_mpiexec("jit")) == [0, 1, 2, 3]


@needs_mpi
def test_mpiexec_shard_map_with_jax_distributed():
    assert _ok_ranks(_mpiexec("shard_map", str(free_port()))) == [0, 1, 2, 3]


@needs_mpi
def test_sdp_groups_of_dp_tp_and_pp_meshes_match_xla_with_one_device_per_process():
    out = _mpiexec(str(free_port()), "1", "dp=2,sdp=2", "sdp=2,tp=2", "pp=2,sdp=2",
                   worker=GROUPS_WORKER)
    assert _ok_ranks(out) == [0, 1, 2, 3]


@needs_mpi
def test_two_processes_of_four_devices_gather_within_then_across_like_xla():
    out = _mpiexec(str(free_port()), "4", "sdp=8", "dp=2,sdp=4", "sdp=4,tp=2", n=2,
                   worker=GROUPS_WORKER)
    assert _ok_ranks(out) == [0, 1]


@needs_mpi
@pytest.mark.slow
def test_four_processes_of_two_devices_like_xla():
    out = _mpiexec(str(free_port()), "2", "sdp=8", "dp=2,sdp=4", worker=GROUPS_WORKER)
    assert _ok_ranks(out) == [0, 1, 2, 3]


@needs_mpi
def test_a_missing_peer_fails_after_the_timeout_naming_collective_rank_and_peer():
    out = _mpiexec("timeout", n=2)
    assert re.search(r"ERROR DEADLINE_EXCEEDED: ffi all_gather traced at __main__:\d+ "
                     r"\(tag \d+\): timed out after 2 s: world rank 0 waited for world ranks "
                     r"\[1\]", out), out
    assert _ok_ranks(out) == [0, 1]


@needs_mpi
@pytest.mark.slow
def test_mpiexec_eight_processes():
    assert _ok_ranks(_mpiexec("jit", n=8)) == list(range(8))


@needs_mpi
def test_single_process_world_is_identity_and_a_cpu_build_rejects_gpus(monkeypatch):
    from collectives.ffi import ops
    assert ops.world_size() == 1 and ops.rank() == 0
    x = jnp.arange(15.0).reshape(3, 5)
    np.testing.assert_array_equal(jax.jit(lambda v: ops.all_gather(v, None, 1))(x), x)
    np.testing.assert_array_equal(jax.jit(lambda v: ops.reduce_scatter(v, None, 0))(x), x)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    with pytest.raises(NotImplementedError, match="no CUDA handlers here: built for CPU only"):
        ops.all_gather(x, None, 0)
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    with pytest.raises(NotImplementedError, match="not on 'tpu'"):
        ops.all_gather(x, None, 0)


def test_missing_compiler_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    with pytest.raises(build.BuildError, match="no C\\+\\+ compiler"):
        build.library_path()


def test_missing_mpi_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("MPI_HOME", str(tmp_path))
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.setattr(build.Path, "exists", lambda self: False)
    with pytest.raises(build.BuildError, match="no MPI found"):
        build.find_mpi()


@needs_mpi
def test_library_is_cached_by_source_hash(monkeypatch, tmp_path):
    monkeypatch.setenv("JAXSMP_COLLECTIVES_CACHE", str(tmp_path))
    first = build.library_path()
    assert first.parent == tmp_path and first.exists()
    mtime = first.stat().st_mtime_ns
    assert build.library_path() == first and first.stat().st_mtime_ns == mtime


def _wheel_nvcc() -> str:
    nvcc = build.wheel_nvcc()
    if nvcc is None:
        pytest.skip("the test extra installs the CUDA 13 compiler wheels (jaxsmp[cuda-build])")
    return nvcc


def _cuda_symbols(lib: Path) -> str:
    return subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True,
                          text=True, check=True).stdout


@pytest.mark.slow
@needs_mpi
def test_cuda_handlers_compile_with_the_wheels_nvcc_for_a100_and_h100(monkeypatch, tmp_path):
    # nvcc from PyPI, CUDA runtime headers and static cudart from PyPI, XLA's FFI headers
    # from jaxlib, mpi.h from the mpich wheel: nothing from the machine but g++
    monkeypatch.setenv("NVCC", _wheel_nvcc())
    monkeypatch.setenv("JAXSMP_COLLECTIVES_CACHE", str(tmp_path))
    monkeypatch.delenv("JAXSMP_CUDA_ARCHS", raising=False)  # the default: sm_80 and sm_90
    lib = build.library_path(cuda=True)
    symbols = _cuda_symbols(lib)
    for name in ["JaxsmpMpiAllGatherCuda", "JaxsmpMpiReduceScatterCuda", "JaxsmpMpiAllGather",
                 "jaxsmp_mpi_cuda_aware", "jaxsmp_mpi_split"]:
        assert re.search(rf" T {name}$", symbols, re.M), name
    assert b"sm_80" in lib.read_bytes() and b"sm_90" in lib.read_bytes()


@pytest.mark.slow
@needs_mpi
def test_a_cuda_compile_error_is_reported_with_the_compilers_message(monkeypatch, tmp_path):
    broken = tmp_path / "broken.cu"
    (tmp_path / build.HEADER.name).write_text(build.HEADER.read_text())
    broken.write_text(build.CUDA_SOURCE.read_text().replace("cudaMemcpyAsync(", "cudaMemcpyAsnc(", 1))
    monkeypatch.setattr(build, "CUDA_SOURCE", broken)
    monkeypatch.setenv("NVCC", _wheel_nvcc())
    monkeypatch.setenv("JAXSMP_COLLECTIVES_CACHE", str(tmp_path))
    monkeypatch.setenv("JAXSMP_CUDA_ARCHS", "90")
    with pytest.raises(build.BuildError, match="(?s)CUDA MPI collectives failed.*cudaMemcpyAsnc"):
        build.library_path(cuda=True)


def test_a_missing_nvcc_is_its_own_error(monkeypatch):
    monkeypatch.setenv("NVCC", "/nonexistent/nvcc")
    with pytest.raises(build.NoCudaCompiler, match="no nvcc found"):
        build.find_nvcc()
