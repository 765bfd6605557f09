"""Simulated CPU devices, for running multi-device code on one machine."""
from __future__ import annotations

import jax


def simulate_cpu_devices(count: int) -> None:
    """Gives JAX's CPU backend ``count`` devices. Call before any JAX computation;
    afterwards it only checks that the CPU backend already has ``count``."""
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:  # backend already started (e.g. XLA_FLAGS set it)
        have = len(jax.devices("cpu"))
        if have != count:
            raise RuntimeError(
                f"asked for {count} simulated CPU devices, but JAX already started with "
                f"{have}; set the count before any JAX computation") from None
