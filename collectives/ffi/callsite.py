"""MPI tags every process derives alike: from where a collective is traced, not from a counter.

A tag hashes the caller's module and line (the first frame outside ``collectives`` and the
JAX/Flax internals), JAX's name stack there (``jvp``/``transpose``/``while`` ... tell the
forward, backward and loop bodies apart), the operation, axis, shape and dtype, and how many
identical keys came earlier: in the enclosing ``collectives.scope(one_program=True)``
(a training step's), else in the same trace. JAX traces a nested ``shard_map`` or loop
body afresh, without a link to the enclosing trace, so only the one-program scope tells
apart two gathers of equal shape traced in separate nested maps. Every process traces
the same program, so every process computes the same tags, whatever else it traced
before or in which order; retracing gives the same tags again.
"""
from __future__ import annotations

import hashlib
import sys
import weakref
from collections import Counter

from collectives import context

_INTERNAL = ("collectives.", "jax.", "jaxlib.", "flax.", "contextlib", "functools")
_seen: weakref.WeakKeyDictionary[object, Counter] = weakref.WeakKeyDictionary()


def caller() -> str:
    """``module:line`` of the first frame outside the collectives and JAX/Flax internals."""
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "?")
        if not module.startswith(_INTERNAL) and module not in ("collectives", "jax", "flax"):
            return f"{module}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def _name_stack() -> str:
    try:
        from jax._src import source_info_util
        return str(source_info_util.current_name_stack())
    except (ImportError, AttributeError):  # private API: older/newer JAX without it
        return ""


def _occurrence(key: str) -> int:
    """How many times ``key`` was seen before in the enclosing one-program scope, else in
    the current trace (0 outside both)."""
    counts = context.current().occurrences
    if counts is None:
        try:
            from jax._src import core
            counts = _seen.setdefault(core.trace_ctx.trace, Counter())
        except (ImportError, AttributeError, TypeError):
            return 0
    counts[key] += 1
    return counts[key] - 1


def tag(op: str, axis_name, shape: tuple[int, ...], dtype, tag_ub: int) -> tuple[int, str]:
    """(MPI tag in ``[0, tag_ub]``, the call site it came from) of a collective traced now."""
    site = caller()
    key = f"{op}|{axis_name}|{tuple(shape)}|{dtype}|{site}|{_name_stack()}"
    key += f"|{_occurrence(key)}"
    digest = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")
    return digest % (tag_ub + 1), site
