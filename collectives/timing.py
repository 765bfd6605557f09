"""Timing of jitted collectives and launching of N local JAX processes (calibrate, bench)."""
from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Callable, Sequence


def median_seconds(fn: Callable[[], object], reps: int, warmup: int = 2) -> float:
    """Median wall time of ``fn()`` (which must block until its result is ready)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(argv_for: Callable[[int, int], Sequence[str]], n: int, timeout: float) -> list[str]:
    """Run ``n`` processes ``argv_for(process_id, port)`` (a free localhost port), return
    their stdout; kill all of them if one fails or the timeout passes."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    procs = [subprocess.Popen([sys.executable, *argv_for(i, port)], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(n)]
    deadline = time.monotonic() + timeout
    outputs = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            if proc.returncode:
                raise RuntimeError(f"worker exited with {proc.returncode}:\n{err[-4000:]}")
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return outputs
