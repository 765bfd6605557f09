"""Automated partitioning of a layer sequence into contiguous pipeline stages.

Each layer's cost comes from XLA: compiled FLOPs and bytes accessed
(``cost_analysis``) give a roofline time; parameter bytes and the compiled
forward's activation bytes give memory. The embedding (if given) is charged to the
first stage and the head to the last. The split is the contiguous one that
minimises the largest stage time (``optimize="speed"``) or stage memory
(``optimize="memory"``); ``manual`` layer counts override it.

The step runs such splits (``pipeline_partition``): :func:`balanced_counts` is the
split of ``pipeline_partition="auto"`` and :mod:`jaxsmp.pipeline.layout` pads stages
to equal slot counts.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from flax import nnx

OPTIMIZE = ("speed", "memory")


@dataclass(frozen=True)
class LayerCost:
    flops: float
    bytes_accessed: float
    param_bytes: int
    activation_bytes: int
    output: Any  # abstract output, the next layer's input

    def time(self, flops_per_s: float, bytes_per_s: float) -> float:
        """Roofline estimate in seconds."""
        return roofline_seconds(self.flops, self.bytes_accessed, flops_per_s, bytes_per_s)


def roofline_seconds(flops: float, bytes_accessed: float, flops_per_s: float,
                     bytes_per_s: float) -> float:
    """Time of work bound by compute or by memory traffic, whichever is slower."""
    return max(flops / flops_per_s, bytes_accessed / bytes_per_s)


def _nbytes(tree: Any) -> int:
    return int(sum(np.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(tree)))


def layer_cost(layer: Callable, x: Any, *args: Any) -> LayerCost:
    """Compiled cost of ``layer(x, *args)`` (an ``nnx.Module`` or a plain function)."""
    if isinstance(layer, nnx.Module):
        graphdef, state = nnx.split(layer)
        fn = lambda s, v: nnx.merge(graphdef, s)(v, *args)
    else:
        state, fn = {}, lambda s, v: layer(v, *args)
    abstract_x = jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype), x)
    compiled = jax.jit(fn).lower(state, abstract_x).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    memory = compiled.memory_analysis()
    out = jax.eval_shape(fn, state, abstract_x)
    activations = _nbytes(out) + int(getattr(memory, "temp_size_in_bytes", 0) or 0)
    return LayerCost(flops=float(cost.get("flops", 0.0)),
                     bytes_accessed=float(cost.get("bytes accessed", 0.0)),
                     param_bytes=_nbytes(state), activation_bytes=activations, output=out)


@dataclass(frozen=True)
class Partition:
    """``counts[s]`` layers on stage ``s``; predicted time and memory per stage and
    per layer (embedding charged to the first layer, head to the last)."""
    counts: tuple[int, ...]
    layer_time: tuple[float, ...]
    layer_memory: tuple[int, ...]
    stage_time: tuple[float, ...]
    stage_memory: tuple[int, ...]
    optimize: str
    manual: bool

    @property
    def balance(self) -> float:
        """Largest over mean stage load of the optimised quantity (1.0: perfect)."""
        load = self.stage_time if self.optimize == "speed" else self.stage_memory
        return max(load) / (sum(load) / len(load))

    @property
    def equal(self) -> bool:
        return len(set(self.counts)) == 1

    def __str__(self) -> str:
        how = "manual" if self.manual else f"optimize={self.optimize!r}"
        lines = [f"pipeline partition ({how}): layers per stage {list(self.counts)}, "
                 f"predicted balance {self.balance:.3f} (max/mean)"]
        for s, (n, t, m) in enumerate(zip(self.counts, self.stage_time, self.stage_memory)):
            lines.append(f"  stage {s}: {n} layers, {t * 1e6:.2f} us, {m / 2**20:.2f} MiB")
        return "\n".join(lines)


def _bounds(loads: Sequence[float], stages: int) -> tuple[int, ...]:
    """Layer counts of the contiguous split minimising the largest stage load."""
    n = len(loads)
    prefix = np.concatenate([[0.0], np.cumsum(loads)])
    best = np.full((stages + 1, n + 1), np.inf)
    cut = np.zeros((stages + 1, n + 1), dtype=int)
    best[0, 0] = 0.0
    index = np.arange(n + 1)
    span = prefix[:, None] - prefix[None, :]      # [i, j]: the load of layers j..i-1
    for s in range(1, stages + 1):  # stage s ends at i, stage s-1 at j < i (first best j)
        ok = (index[None, :] < index[:, None]) & (index[None, :] >= s - 1)
        cost = np.where(ok, np.maximum(best[s - 1][None, :], span), np.inf)
        cut[s] = np.argmin(cost, axis=1)
        best[s] = cost[index, cut[s]]
    counts, i = [], n
    for s in range(stages, 0, -1):
        counts.append(i - cut[s, i])
        i = cut[s, i]
    return tuple(int(c) for c in reversed(counts))


def balanced_counts(loads: Sequence[float], parts: int, *, first: float = 0.0,
                    last: float = 0.0, tolerance: float = 0.02) -> tuple[int, ...]:
    """Layers per part of the contiguous split of ``loads`` (one per layer; ``first``
    and ``last`` added to the first and last part) minimising the largest part. The
    equal split is kept unless the best is more than ``tolerance`` faster."""
    if not 1 <= parts <= len(loads):
        raise ValueError(f"cannot split {len(loads)} layers into {parts} pipeline stages "
                         f"(each needs at least one layer)")
    charged = list(loads)
    charged[0] += first
    charged[-1] += last
    best = _bounds(charged, parts)
    if len(loads) % parts == 0:
        equal = (len(loads) // parts,) * parts
        if max(_stage_sums(charged, equal)) <= (1 + tolerance) * max(
                _stage_sums(charged, best)):
            return equal
    return best


def _check_manual(manual: Sequence[int], layers: int, stages: int) -> tuple[int, ...]:
    counts = tuple(manual)
    if len(counts) != stages or any(not isinstance(c, int) or c < 1 for c in counts) \
            or sum(counts) != layers:
        raise ValueError(
            f"manual partition {list(counts)} must give each of the {stages} stages at "
            f"least one layer and sum to the {layers} layers")
    return counts


def _stage_sums(values: Sequence[float], counts: Sequence[int]) -> list[float]:
    edges = np.concatenate([[0], np.cumsum(counts)])
    return [float(sum(values[a:b])) for a, b in zip(edges[:-1], edges[1:])]


def stack_layers(stack: Any) -> list[nnx.Module]:
    """The layers of a :class:`~jaxsmp.nn.Stack` as separate modules (for costing)."""
    graphdef, state = nnx.split(stack.layers)
    return [nnx.merge(graphdef, jax.tree.map(lambda a, i=i: a[i], state))
            for i in range(stack.num_layers)]


def partition(layers: Sequence[Callable], x: Any, stages: int, *,
              embed: Callable | None = None, head: Callable | None = None,
              layer_args: Sequence[Any] = (),
              optimize: str = "speed", manual: Sequence[int] | None = None,
              flops_per_s: float = 1e12, bytes_per_s: float = 1e11,
              verbose: bool = True) -> Partition:
    """Splits ``layers`` (``layer(x, *layer_args)`` in order, on ``x`` or on
    ``embed(x)``) into ``stages`` contiguous stages; prints the split unless
    ``verbose=False``."""
    if optimize not in OPTIMIZE:
        raise ValueError(f"optimize must be one of {OPTIMIZE}, got {optimize!r}")
    if not 1 <= stages <= len(layers):
        raise ValueError(f"cannot split {len(layers)} layers into {stages} stages")
    extra: list[LayerCost] = []
    if embed is not None:
        extra.append(layer_cost(embed, x))
        x = extra[0].output
    costs = []
    for layer in layers:
        costs.append(layer_cost(layer, x, *layer_args))
        x = costs[-1].output
    tail = layer_cost(head, x) if head is not None else None
    times = [c.time(flops_per_s, bytes_per_s) for c in costs]
    memory = [c.param_bytes + c.activation_bytes for c in costs]
    first = [(c.time(flops_per_s, bytes_per_s), c.param_bytes + c.activation_bytes)
             for c in extra]
    last = [] if tail is None else [(tail.time(flops_per_s, bytes_per_s),
                                     tail.param_bytes + tail.activation_bytes)]
    # embedding and head pinned to the ends: charge them to the first / last layer
    load_t, load_m = list(times), list(memory)
    for t, m in first:
        load_t[0] += t
        load_m[0] += m
    for t, m in last:
        load_t[-1] += t
        load_m[-1] += m
    if manual is not None:
        counts = _check_manual(manual, len(layers), stages)
    else:
        counts = _bounds(load_t if optimize == "speed" else load_m, stages)
    result = Partition(counts, tuple(load_t), tuple(load_m), tuple(_stage_sums(load_t, counts)),
                       tuple(int(v) for v in _stage_sums(load_m, counts)),
                       optimize, manual is not None)
    if verbose:
        print(result)
    return result
