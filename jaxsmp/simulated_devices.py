"""Simulated CPU devices, for running multi-device code on one machine.

XLA:CPU runs every simulated device's collectives on one shared intra-op thread pool
(``tf_XLAEigen``), whose threads block in each collective's rendezvous until all its
participants arrive. The pool has as many threads as the host has cores or devices,
whichever is more (8 for 8 devices on 2 cores), but one device can be inside several
collectives at once (one in a pipeline's loop, one outside it), so a pipeline step over
8 devices could fill all 8 threads with collectives whose last participants were still
queued behind them: a hang, in 3 of 6 runs of 60 ``pp=2, sdp=4`` steps on a 2-core host
(jax 0.10.2; none in 760 steps with the pool below). XLA sizes the pool from the
``PJRT_NPROC`` environment variable (or the devices, if more), read when the CPU backend
starts; jaxsmp sets it to :data:`THREADS_PER_DEVICE` threads per simulated device unless
the user set it.
"""
from __future__ import annotations

import os
from collections.abc import MutableMapping

import jax

THREADS_PER_DEVICE = 8
POOL_SIZE_VAR = "PJRT_NPROC"


def set_pool_size(count: int, env: MutableMapping[str, str] | None = None) -> None:
    """Sizes XLA:CPU's intra-op pool in ``env`` (default ``os.environ``) for ``count``
    simulated devices, unless ``PJRT_NPROC`` is already set. Takes effect for a CPU
    backend started afterwards (this process's or a child process's)."""
    env = os.environ if env is None else env
    env.setdefault(POOL_SIZE_VAR, str(THREADS_PER_DEVICE * count))


def simulate_cpu_devices(count: int) -> None:
    """Gives JAX's CPU backend ``count`` devices and a thread pool they cannot starve.
    Call before any JAX computation; afterwards it only checks that the CPU backend
    already has ``count``."""
    set_pool_size(count)
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:  # backend already started (e.g. XLA_FLAGS set it)
        have = len(jax.devices("cpu"))
        if have != count:
            raise RuntimeError(
                f"asked for {count} simulated CPU devices, but JAX already started with "
                f"{have}; set the count before any JAX computation") from None
