"""Compile ``mpi_collectives.cc`` once into a cache directory keyed by a hash of its inputs."""
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


class BuildError(RuntimeError):
    """No compiler or no MPI installation, or the compile failed."""


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


def _command(cxx: str, inc: Path, lib: Path, out: Path) -> list[str]:
    return [cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-o", str(out), str(SOURCE),
            f"-I{jax.ffi.include_dir()}", f"-I{inc}", f"-L{lib}", "-lmpi", f"-Wl,-rpath,{lib}"]


def library_path() -> Path:
    """Path of the compiled library, compiling it on first use (safe across processes)."""
    cxx = find_compiler()
    inc, lib = find_mpi()
    probe = _command(cxx, inc, lib, Path("OUT"))
    key = hashlib.sha256(SOURCE.read_bytes() + "\0".join(probe).encode()).hexdigest()[:16]
    out = cache_dir() / f"mpi_collectives-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one compiler per machine; others wait and reuse
        if not out.exists():
            tmp = out.with_suffix(f".{os.getpid()}.tmp")
            run = subprocess.run(_command(cxx, inc, lib, tmp), capture_output=True, text=True)
            if run.returncode:
                raise BuildError(f"compiling {SOURCE.name} failed:\n{run.stderr}")
            os.replace(tmp, out)
    return out
