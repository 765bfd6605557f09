"""What the collectives read besides their arguments, set for a ``with`` block.

The caller that owns the mesh (e.g. a training step) enters a scope around the
``jax.shard_map`` it traces; every collective traced inside reads it::

    with collectives.scope(mesh=jax_mesh, cost_model=profile, timeout=60):
        out = jax.shard_map(body, mesh=jax_mesh, ...)(x)

``mesh``: host groups of an axis (``topology`` for ``hierarchical`` and ``auto``) and the
MPI groups of the ``ffi`` algorithm. ``cost_model``: what ``auto`` predicts with (default:
the calibration cached for this host and backend, see :mod:`collectives.profile`).
``timeout``: seconds an ``ffi`` collective waits for its peers before it fails.
Nested scopes keep the outer scope's values for what they do not set. A scope is read
while tracing, so set it around the traced call, not around a call of an
already-compiled function. ``one_program=True`` declares that the block traces exactly
one program (as a training step's scope does): the ``ffi`` MPI tags then count equal
calls across all its nested traces (:mod:`collectives.ffi.callsite`), so that two
collectives of equal shape in separate nested maps never share a tag.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jax

_UNSET: Any = object()


@dataclass(frozen=True)
class Scope:
    mesh: jax.sharding.Mesh | None = None
    cost_model: Any = None  # collectives.CostModel; None: cached calibration or defaults
    timeout: float | None = None  # None: $JAXSMP_COLLECTIVES_TIMEOUT or 300 s
    # ffi tag keys counted so far in the enclosing one-program scope (else None)
    occurrences: Counter | None = dataclasses.field(default=None, compare=False)
    # where auto's choices are appended while tracing: (op, Decision) (None: nowhere)
    decisions: list | None = dataclasses.field(default=None, compare=False)


_CURRENT = contextvars.ContextVar("collectives_scope", default=Scope())


def current() -> Scope:
    """The innermost active scope (an empty :class:`Scope` outside any)."""
    return _CURRENT.get()


@contextlib.contextmanager
def scope(*, mesh: jax.sharding.Mesh | None = _UNSET, cost_model: Any = _UNSET,
          timeout: float | None = _UNSET, one_program: bool = False,
          decisions: list | None = _UNSET) -> Iterator[Scope]:
    """Set ``mesh``, ``cost_model`` and/or ``timeout`` for the collectives traced inside;
    ``one_program``: the block traces one program (see the module docstring);
    ``decisions``: a list that gets ``(op, auto.Decision)`` for each ``auto`` choice."""
    given = {k: v for k, v in dict(mesh=mesh, cost_model=cost_model, timeout=timeout,
                                   decisions=decisions).items() if v is not _UNSET}
    if one_program:
        given["occurrences"] = Counter()
    if given.get("timeout") is not None and not given["timeout"] > 0:
        raise ValueError(f"timeout={given['timeout']!r} must be a positive number of seconds")
    token = _CURRENT.set(dataclasses.replace(_CURRENT.get(), **given))
    try:
        yield _CURRENT.get()
    finally:
        _CURRENT.reset(token)
