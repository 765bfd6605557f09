"""Compile the MPI collectives once into a cache directory keyed by a hash of their inputs.

CPU build: ``mpi_collectives.cc`` with g++ (``$CXX``). CUDA build: the same file plus
``mpi_collectives_cuda.cu`` with nvcc (``$NVCC``, else ``nvcc`` on PATH, in
``$CUDA_HOME/bin``, or from the CUDA 13 compiler wheels of the ``cuda-build`` extra), for
the GPU architectures in ``$JAXSMP_CUDA_ARCHS`` (default 80,90).
Both link the MPI found by :func:`find_mpi` (``$MPI_HOME`` first: point it at a site's
CUDA-aware MPI).
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import jax

SOURCE = Path(__file__).with_name("mpi_collectives.cc")
CUDA_SOURCE = Path(__file__).with_name("mpi_collectives_cuda.cu")
HEADER = Path(__file__).with_name("mpi_common.h")


class BuildError(RuntimeError):
    """No compiler or no MPI installation, or the compile failed."""


class NoCudaCompiler(BuildError):
    """No nvcc: the CUDA handlers cannot be built on this machine."""


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "jaxsmp-collectives"
    return Path(os.environ.get("JAXSMP_COLLECTIVES_CACHE", default))


def find_compiler() -> str:
    wanted = os.environ.get("CXX")
    cxx = shutil.which(wanted) if wanted else shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise BuildError("no C++ compiler found: install g++ (apt-get install g++) or set CXX")
    return cxx


def find_mpi() -> tuple[Path, Path]:
    """(include dir with mpi.h, lib dir with libmpi.so): $MPI_HOME, then the Python prefix
    (the ``mpich`` wheel: ``pip install 'jaxsmp[mpi]'``), then /usr/local and /usr."""
    roots = [os.environ.get("MPI_HOME"), sys.prefix, site.getuserbase(), "/usr/local", "/usr"]
    for root in filter(None, roots):
        inc, lib = Path(root) / "include", Path(root) / "lib"
        if (inc / "mpi.h").exists() and (lib / "libmpi.so").exists():
            return inc, lib
    raise BuildError("no MPI found (mpi.h and libmpi.so): pip install 'mpich>=4.1' "
                     "(the jaxsmp[mpi] extra) or set MPI_HOME")


def find_mpiexec() -> str | None:
    """``mpiexec`` next to this Python (the mpich wheel), in the user base, or on PATH."""
    for where in (Path(sys.executable).parent, Path(site.getuserbase()) / "bin", None):
        found = shutil.which("mpiexec", path=None if where is None else str(where))
        if found:
            return found
    return None


def wheel_nvcc() -> str | None:
    """nvcc of the ``nvidia-cuda-nvcc`` wheel (CUDA 13: ``nvidia/cu13/bin``; with
    ``nvidia-nvvm``, ``-cuda-crt``, ``-cuda-runtime`` and ``-cuda-cccl`` beside it, a
    whole compiler from PyPI). The ``nvidia-cuda-nvcc-cu12`` wheels ship only ptxas."""
    for root in [*site.getsitepackages(), site.getusersitepackages()]:
        nvcc = Path(root) / "nvidia" / "cu13" / "bin" / "nvcc"
        if nvcc.exists():
            return str(nvcc)
    return None


def find_nvcc() -> str:
    """nvcc from ``$NVCC``, PATH, ``$CUDA_HOME/bin`` or :func:`wheel_nvcc`."""
    wanted = os.environ.get("NVCC")
    if wanted:
        nvcc = shutil.which(wanted)
    else:
        home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
        nvcc = shutil.which("nvcc") or shutil.which("nvcc", path=f"{home}/bin") or wheel_nvcc()
    if not nvcc:
        raise NoCudaCompiler("no nvcc found (PATH, $NVCC, $CUDA_HOME/bin, the nvidia-cuda-nvcc "
                             "wheel): pip install 'jaxsmp[cuda-build]' or the CUDA toolkit to "
                             "build the CUDA handlers of the ffi collectives")
    return nvcc


def _archs() -> list[str]:
    archs = os.environ.get("JAXSMP_CUDA_ARCHS", "80,90").split(",")
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    ptx = f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}"  # JIT for newer GPUs
    return flags + [ptx]


def _command(cuda: bool, inc: Path, lib: Path, out: Path) -> list[str]:
    common = ["-O2", "-std=c++17", "-shared", "-o", str(out), str(SOURCE),
              "-isystem", jax.ffi.include_dir(), f"-I{inc}", f"-L{lib}", "-lmpi"]
    if cuda:
        nvcc = find_nvcc()
        cudart = Path(nvcc).resolve().parents[1] / "lib"  # the wheels' static runtime
        return [nvcc, *common, str(CUDA_SOURCE), "-Xcompiler", "-fPIC", *_archs(),
                f"-L{cudart}", "-Xlinker", f"-rpath,{lib}"]
    return [find_compiler(), *common, "-fPIC", f"-Wl,-rpath,{lib}"]


def library_path(cuda: bool = False) -> Path:
    """Path of the compiled library (with the CUDA handlers if ``cuda``), compiling it on
    first use (safe across processes)."""
    inc, lib = find_mpi()
    probe = _command(cuda, inc, lib, Path("OUT"))
    sources = b"".join(f.read_bytes() for f in [SOURCE, HEADER] + ([CUDA_SOURCE] if cuda else []))
    key = hashlib.sha256(sources + "\0".join(probe).encode()).hexdigest()[:16]
    out = cache_dir() / f"mpi_collectives{'_cuda' if cuda else ''}-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one compiler per machine; others wait and reuse
        if not out.exists():
            tmp = out.with_suffix(f".{os.getpid()}.tmp")
            run = subprocess.run(_command(cuda, inc, lib, tmp), capture_output=True, text=True)
            if run.returncode:
                raise BuildError(f"compiling the {'CUDA' if cuda else 'CPU'} MPI collectives "
                                 f"failed:\n{run.stderr[-6000:]}")
            os.replace(tmp, out)
    return out
