"""Device memory in use, as the runtime reports it."""
from __future__ import annotations

import jax


def device_memory_in_use() -> int | None:
    """The most bytes in use on any of this process's devices, or None where the
    backend keeps no statistics (XLA:CPU)."""
    in_use = [(d.memory_stats() or {}).get("bytes_in_use") for d in jax.local_devices()]
    known = [b for b in in_use if b is not None]
    return max(known) if known else None
