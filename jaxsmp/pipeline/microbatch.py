"""Splitting a batch, and a layer stack's per-example arguments, into microbatches; running
them one at a time."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np


def split_microbatches(batch: Any, microbatches: int) -> Any:
    """``[b, ...]`` -> ``[microbatches, b // microbatches, ...]`` (contiguous rows)."""
    def split(x):
        return x.reshape(microbatches, x.shape[0] // microbatches, *x.shape[1:])
    return jax.tree.map(split, batch)


def one_at_a_time(acc: Any, microbatch: Any) -> tuple[Any, Any]:
    """``(acc, microbatch)`` unchanged, behind an optimization barrier: a gradient
    accumulation loop's next microbatch starts after the previous one's backward, so one
    microbatch's activations are live at a time, as accumulation promises and the
    planner's memory model counts. Without it XLA:GPU's latency-hiding scheduler and
    pipelined gathers (jaxsmp's GPU flags) run the next forward beside the backward:
    GPT-NeoX 13b on 128 A100-40GB, 4 x 2 microbatches, remat save_matmuls, compiled to
    46.9 GiB of temporaries per GPU, 29.65 with the barrier (the planner's model: 29.7)."""
    return jax.lax.optimization_barrier((acc, microbatch))


def split_args(args: Sequence[Any], batch: int, microbatches: int) -> tuple[list, list[bool]]:
    """(args split like the stack input, which were split): an argument whose leading
    dimension is the ``batch`` size is per example (e.g. positions); others are shared."""
    per_example = [np.ndim(a) >= 1 and np.shape(a)[0] == batch for a in args]
    out = [split_microbatches(a, microbatches) if s else a for a, s in zip(args, per_example)]
    return out, per_example


def pick(args: Sequence[Any], per_example: Sequence[bool], microbatch) -> list:
    """The arguments of one microbatch (:func:`split_args`'s output)."""
    return [a[microbatch] if s else a for a, s in zip(args, per_example)]
