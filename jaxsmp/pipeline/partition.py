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

import functools
from dataclasses import dataclass
from typing import Any, Callable, Sequence

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
        fn = lambda s, v: nnx.merge(graphdef, s)(v, *args)  # noqa: E731
    else:
        state, fn = {}, lambda s, v: layer(v, *args)  # noqa: E731
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


@dataclass(frozen=True)
class OneFOneBSplit:
    """Layers per 1F1B stage, and whether the head is spread over the stages."""
    counts: tuple[int, ...]
    spread_head: bool
    seconds: float


def one_f_one_b_split(num_layers: int, stages: int, microbatches: int, layer_forward: float,
                      layer_backward: float, head: float, *, can_spread: bool,
                      counts: Sequence[int] | None = None, fused: bool = False,
                      placement: str = "auto", tolerance: float = 0.02) -> OneFOneBSplit:
    """The faster of the head on the last stage and the head spread over the stages
    (``can_spread``: the microbatch's examples divide by ``stages``), each with its
    fastest split (:func:`one_f_one_b_counts`; with ``fused`` ticks, the most even)
    or with the given ``counts``; the last stage keeps the head unless spreading it
    is ``tolerance`` faster. ``placement``: ``"last"`` or ``"spread"`` fixes it."""
    def best(spread: bool) -> OneFOneBSplit:
        if counts is not None:
            split = tuple(counts)
        elif fused:  # the head runs between the slots, outside every stage's ops
            split = balanced_counts([1.0] * num_layers, stages)
        else:
            split = one_f_one_b_counts(num_layers, stages, microbatches, layer_forward,
                                       layer_backward, head, tolerance, spread_head=spread)
        timing = fused_seconds if fused else one_f_one_b_seconds
        return OneFOneBSplit(split, spread, timing(
            split, microbatches, layer_forward, layer_backward, head, spread_head=spread))
    if placement != "auto":
        return best(placement == "spread")
    last = best(False)
    if not can_spread:
        return last
    spread = best(True)
    return spread if spread.seconds * (1 + tolerance) < last.seconds else last


def one_f_one_b_counts(num_layers: int, stages: int, microbatches: int, layer_forward: float,
                       layer_backward: float, head: float,
                       tolerance: float = 0.02, spread_head: bool = False) -> tuple[int, ...]:
    """Layers per stage of the 1F1B schedule run in lock-step (every tick as long as its
    slowest op): a stage's forward is its layers' forward (the last stage's also the
    head's forward and backward, unless ``spread_head``), its backward its layers'
    recompute and backward. Local search from the equal and the load-balanced splits,
    each move one layer between neighbours; the equal split stays unless another is
    ``tolerance`` faster."""
    def seconds(counts):
        return one_f_one_b_seconds(counts, microbatches, layer_forward, layer_backward, head,
                                   spread_head=spread_head)
    starts = [balanced_counts([layer_forward + layer_backward] * num_layers, stages,
                              last=0.0 if spread_head else head)]
    best = min((_descend(list(c), seconds) for c in starts), key=seconds)
    if num_layers % stages == 0:
        equal = (num_layers // stages,) * stages
        best = min(best, _descend(list(equal), seconds), key=seconds)
        if seconds(equal) <= (1 + tolerance) * seconds(best):
            return equal
    return best


def one_f_one_b_seconds(counts: Sequence[int], microbatches: int, layer_forward: float,
                        layer_backward: float, head: float, spread_head: bool = False) -> float:
    """Seconds of the 1F1B ticks in lock-step with ``counts`` layers per stage (as
    :func:`jaxsmp.pipeline.simulator.lockstep_time`, on the schedule's table at once).
    ``spread_head``: every tick in which the last stage runs a forward is followed by
    ``head / stages`` on every stage."""
    kinds = _one_f_one_b_kinds(len(counts), microbatches)
    n = np.asarray(counts, float)
    forward = n * layer_forward
    if not spread_head:
        forward[-1] += head
    ops = np.where(kinds == 1, forward, np.where(kinds == 2, n * layer_backward, 0.0))
    ticks = ops.max(axis=1)
    if spread_head:
        ticks = ticks + np.where(kinds[:, -1] == 1, head / len(counts), 0.0)
    return float(ticks.sum())


def fused_seconds(counts: Sequence[int], microbatches: int, layer_forward: float,
                  layer_backward: float, head: float, spread_head: bool = False) -> float:
    """Seconds of 1F1B's fused lock-step ticks (:mod:`jaxsmp.pipeline.fused_ticks`):
    ``m + p - 1`` forward and as many backward slots, each as long as its busiest
    stage's layers, and ``m`` heads between them (``1/p`` of one with ``spread_head``)."""
    p, busiest = len(counts), max(counts)
    slots = (microbatches + p - 1) * busiest * (layer_forward + layer_backward)
    return slots + microbatches * head / (p if spread_head else 1)


@functools.lru_cache(maxsize=64)
def _one_f_one_b_kinds(stages: int, microbatches: int) -> np.ndarray:
    """``[tick, stage]``: 0 idle, 1 forward, 2 backward."""
    from jaxsmp.pipeline.schedule import make_schedule
    table = make_schedule("interleaved", stages, microbatches).table
    return np.array([[0 if op is None else 1 if op.kind == "F" else 2 for op in row]
                     for row in table]).T


def _descend(counts: list[int], seconds) -> tuple[int, ...]:
    """Moves single layers between neighbouring stages while the time improves."""
    current = seconds(counts)
    while True:
        moves = []
        for i in range(len(counts) - 1):
            for a, b in ((i, i + 1), (i + 1, i)):
                if counts[a] > 1:
                    c = list(counts)
                    c[a], c[b] = c[a] - 1, c[b] + 1
                    moves.append((seconds(c), c))
        if not moves or min(moves)[0] >= current:
            return tuple(counts)
        current, counts = min(moves)


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
