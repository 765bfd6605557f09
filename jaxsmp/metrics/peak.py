"""A device's peak FLOP/s: known for accelerators, measured with a matmul otherwise."""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp

# Dense bf16 peaks from the vendors' data sheets.
KNOWN_PEAKS = {"A100": 312e12, "H100": 989e12, "H200": 989e12, "A10G": 125e12,
               "L4": 121e12, "V100": 125e12, "TPU v4": 275e12, "TPU v5": 459e12}


def _measured_peak(device: jax.Device, n: int = 1024, repeats: int = 5) -> float:
    a = jax.device_put(jnp.ones((n, n), jnp.float32), device)
    matmul = jax.jit(lambda x: x @ x)
    matmul(a).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a).block_until_ready()
        times.append(time.perf_counter() - start)
    return 2 * n ** 3 / min(times)


def peak_flops_per_device(device: jax.Device | None = None) -> tuple[float, str]:
    """(FLOP/s, where the number came from) for ``device`` (default: this process's first)."""
    device = device or jax.local_devices()[0]
    for name, peak in KNOWN_PEAKS.items():
        if name in device.device_kind:
            return peak, f"data sheet ({device.device_kind})"
    return _measured_peak(device), f"measured {device.platform} float32 matmul"
