"""What the sections share: skipping a row with a reason, timing, peak memory, batches."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

MiB = 2 ** 20


class Skip(Exception):
    """A row that cannot run here (a missing capability, a shape that does not fit); its
    message is the reason recorded."""


def time_steps(step: Callable[[], object], block: Callable[[object], object], *,
               deadline: float, min_steps: int = 3, max_steps: int = 10,
               target_s: float = 4.0) -> dict:
    """Runs ``step`` once (compile and warm-up), then times steps one by one, each waited
    for with ``block``: at least ``min_steps``, at most ``max_steps``, stopping after
    ``target_s`` seconds of timed steps or at ``deadline`` (``time.time()``); the median."""
    start = time.perf_counter()
    block(step())
    first = time.perf_counter() - start
    times: list[float] = []
    while len(times) < max_steps:
        if len(times) >= min_steps and (sum(times) > target_s or time.time() > deadline):
            break
        start = time.perf_counter()
        block(step())
        times.append(time.perf_counter() - start)
    return {"first_call_s": first, "step_s": statistics.median(times), "steps": len(times)}


def time_loop(call: Callable[[], object], block: Callable[[object], object], *,
              deadline: float, target_s: float = 1.0, max_iters: int = 50) -> dict:
    """For short kernels: one call to compile, one timed call to size the loop, then
    ``n`` calls launched back to back and waited for once; seconds per call."""
    start = time.perf_counter()
    block(call())
    first = time.perf_counter() - start
    start = time.perf_counter()
    block(call())
    one = time.perf_counter() - start
    left = max(0.0, deadline - time.time())
    n = int(max(1, min(max_iters, min(target_s, left / 2) / max(one, 1e-6))))
    start = time.perf_counter()
    out = None
    for _ in range(n):
        out = call()
    block(out)
    return {"first_call_s": first, "call_s": (time.perf_counter() - start) / n, "calls": n}


def jax_peak_bytes() -> int | None:
    """``peak_bytes_in_use`` of the first device since this process started (None where
    the backend keeps no statistics: XLA:CPU)."""
    import jax
    stats = jax.local_devices()[0].memory_stats() or {}
    return stats.get("peak_bytes_in_use")


def platform() -> str:
    import jax
    return jax.devices()[0].platform


def random_tokens(batch: int, seq: int, vocab: int, seed: int = 0):
    import numpy as np
    return np.random.default_rng(seed).integers(0, vocab, (batch, seq), dtype=np.int32)


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]
