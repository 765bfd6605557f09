"""The cost model ``auto`` uses when none is given: the calibration cached for this host and
backend, else public constants on a GPU, else none (``auto`` then uses ``xla``, and says so).

Calibrations live in ``$JAXSMP_COLLECTIVES_PROFILE_DIR`` (default
``~/.cache/jaxsmp/collectives``) as ``<host>-<backend>.json``, written by
``python -m collectives.calibrate``.
"""
from __future__ import annotations

import os
import socket
from functools import lru_cache
from pathlib import Path

import jax

from collectives.cost_model import CostModel


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "jaxsmp" / "collectives"
    return Path(os.environ.get("JAXSMP_COLLECTIVES_PROFILE_DIR", default))


def cached_path(backend: str | None = None, host: str | None = None) -> Path:
    """Where the calibration of ``host`` (default: this one) and ``backend`` is cached."""
    backend = backend or jax.default_backend()
    return cache_dir() / f"{host or socket.gethostname()}-{backend}.json"


@lru_cache(maxsize=8)
def _load(path: Path, mtime_ns: int) -> CostModel:
    return CostModel.load(path)


def default_model(backend: str | None = None) -> tuple[CostModel | None, str]:
    """(model, why): the cached calibration, public GPU constants, or None on CPU."""
    backend = backend or jax.default_backend()
    path = cached_path(backend)
    if path.exists():
        return _load(path, path.stat().st_mtime_ns), f"calibration {path}"
    if backend == "gpu":
        return CostModel.p4d(), (f"no calibration at {path}: public GPU constants "
                                 "(python -m collectives.calibrate measures this machine)")
    return None, (f"no calibration at {path} for backend {backend!r}: auto uses xla "
                  "(python -m collectives.calibrate measures this machine)")
