"""With several processes, a step's program first runs only once every process has
compiled it.

XLA:CPU's gloo collectives give the processes a fixed 30 s to join a device group's
first collective (gloo's default rendezvous timeout, which XLA does not expose); a
process still compiling on a loaded host can be later than that, and the run fails with
``Gloo context initialization failed: DEADLINE_EXCEEDED``. So each process compiles
first and waits at a barrier of JAX's coordination service, which allows minutes,
before the first run. The call after it traces the step again (once per program) and
takes the executable from JAX's in-memory compilation cache.
"""
from __future__ import annotations

import itertools
from typing import Any

import jax
import jax.numpy as jnp

MEET_TIMEOUT_S = 600   # as long as XLA:CPU lets a collective wait (tests/conftest.py)
_MEETINGS = itertools.count()   # barrier names are used once; processes count alike


class FirstRuns:
    """Remembers which programs every process has compiled and met before."""

    def __init__(self) -> None:
        self._met: set = set()

    def meet(self, jitted: Any, plan: Any, state: Any, batch: Any) -> None:
        """Before ``jitted(state, batch)`` first runs for this plan, state structure and
        batch shapes: compile it, then wait for the other processes to have done the
        same (nothing with one process)."""
        if jax.process_count() == 1:
            return
        key = (id(jitted), plan, jax.tree.structure(state),
               str(jax.tree.map(lambda x: (jnp.shape(x), jnp.result_type(x)), batch)))
        if key in self._met:
            return
        from orbax.checkpoint import multihost  # its barrier: JAX's coordination service
        jitted.lower(state, batch).compile()
        multihost.get_barrier_sync_fn()(key=f"jaxsmp_first_run_{next(_MEETINGS)}",
                                        timeout_ms=MEET_TIMEOUT_S * 1000)
        self._met.add(key)
