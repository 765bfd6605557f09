"""Every configuration that divides the cluster and the global batch, ranked."""
from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jaxsmp.checks import positive_int
from jaxsmp.context import RING_IMPLS
from jaxsmp.models.registry import preset
from jaxsmp.nn.remat import POLICIES
from jaxsmp.pipeline.schedule import SCHEDULES
from jaxsmp.plan.calibration import FITTED, Fitted
from jaxsmp.plan.candidate import TARGET, Candidate, Semantics
from jaxsmp.plan.hardware import Cluster
from jaxsmp.plan.memory import MemoryBreakdown, capacity, estimate_memory, fits, temporaries_limit
from jaxsmp.plan.rates import Throughput, throughput
from jaxsmp.plan.throughput import StepTime, estimate_time
from jaxsmp.plan.workload import Workload
from jaxsmp.train.options import REDUCE_DTYPES

GiB = 1 << 30
VIRTUAL_CHUNKS = (2,)   # chunks per stage the search tries for the virtual schedule
CONTEXT_DEGREES = (1, 2, 4, 8)   # cp degrees the search tries (cp x tp inside a node)
# Sequences from this length on are also tried with cp > 1; shorter ones only when no
# cp = 1 configuration fits.
LONG_SEQUENCE = 8192


@dataclass(frozen=True)
class Plan:
    """One candidate with its predicted memory, step time and throughput."""
    candidate: Candidate
    memory: MemoryBreakdown
    time: StepTime
    throughput: Throughput
    capacity: float

    @property
    def temporaries_limit(self) -> float:
        """What XLA plans the step's temporaries within (:func:`temporaries_limit`)."""
        return temporaries_limit(self.capacity, self.memory.arguments)

    @property
    def within_xla_limit(self) -> bool:
        return bool(self.memory.temporaries <= self.temporaries_limit)

    @property
    def fits(self) -> bool:
        """In the allocator's memory, and its temporaries within XLA's limit (above it
        XLA recomputes and the step is not the one planned)."""
        return fits(self.memory, self.capacity)

    def as_dict(self) -> dict:
        c, t = self.candidate, self.throughput
        return {**c.as_dict(), "memory_gib_per_gpu": self.memory.total / GiB,
                "capacity_gib_per_gpu": self.capacity / GiB,
                "xla_temporaries_limit_gib_per_gpu": self.temporaries_limit / GiB,
                "memory_breakdown_gib": self.memory.as_gib(), "memory_peak_at": self.memory.phase,
                "pipeline_partition": list(self.time.stages),
                "pipeline_head": "spread" if self.time.spread_head else "last",
                "step_seconds": t.step_seconds,
                "time_breakdown_seconds": {k: v for k, v in vars(self.time).items()
                                           if k not in ("stages", "spread_head")},
                "tokens_per_second": t.tokens_per_second, "tflops_per_gpu": t.model_tflops_per_gpu,
                "hardware_tflops_per_gpu": t.hardware_tflops_per_gpu, "mfu": t.mfu,
                "fits": self.fits}


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def load_model(model: Any):
    """A model config from a config object, ``family:preset`` (``gpt_neox:13b``), or a
    Hugging Face ``config.json`` (its path or its directory's)."""
    if not isinstance(model, (str, Path)):
        return model
    path = Path(model)
    if path.name == "config.json" or path.is_dir():
        from jaxsmp.hf import load_config
        return load_config(path.parent if path.name == "config.json" else path)[1]
    family, sep, name = str(model).partition(":")
    if not sep:
        raise ValueError(f"model {model!r}: give 'family:preset' (e.g. gpt_neox:13b) or a "
                         f"Hugging Face config.json path")
    return preset(family, name)


def candidates(w: Workload, cluster: Cluster, global_batch: int, precision: str = "bf16",
               remats: Sequence[str] = POLICIES, schedules: Sequence[str] = SCHEDULES,
               sequence_parallel: bool = False,
               context: Sequence[int] | None = None,
               reduce_dtype: str | None = None) -> Iterator[Candidate]:
    """Every (dp, ep, sdp, tp, pp, cp, microbatch, remat, schedule) dividing the cluster,
    the global batch and the model (whole heads per tp rank); tp x cp stays inside a node.
    A mixture of experts also tries every ``ep`` dividing its expert count and the data
    devices, with cp = 1 and no 1F1B (what the step runs for it).
    ``reduce_dtype``: every candidate's (``None``: the step's default for ``precision``;
    not searched, bf16 reduction only ever moves fewer bytes).
    ``context``: the cp degrees to try (default :data:`CONTEXT_DEGREES` for sequences of
    at least :data:`LONG_SEQUENCE` tokens, else cp = 1 only)."""
    if context is None:
        context = CONTEXT_DEGREES if w.seq_len >= LONG_SEQUENCE else (1,)
    if w.experts:
        if sequence_parallel:
            raise ValueError("sequence_parallel is not run with a mixture of experts "
                             "(docs/moe.md); plan without it")
        context = (1,)
        schedules = tuple(s for s in schedules if s != "interleaved")
    for dp, ep, sdp, tp, pp, cp in _meshes(w, cluster, global_batch, context):
        local = global_batch // (dp * ep * sdp)
        for mbs in divisors(local):
            for remat in remats:
                for schedule, chunks in _schedules(w, pp, local // mbs, schedules):
                    yield Candidate(dp, sdp, tp, pp, mbs, local // mbs, remat, precision,
                                    schedule, chunks, sequence_parallel, cp, reduce_dtype,
                                    ep)


def _meshes(w: Workload, cluster: Cluster, global_batch: int, context: Sequence[int]):
    """(dp, ep, sdp, tp, pp, cp) dividing the cluster, the batch (over dp x ep x sdp)
    and the model; cp only with pp = 1, on sequences of a multiple of 2 cp tokens; ep
    (> 1 only for a mixture of experts) divides the expert count."""
    world, per_node = cluster.world, cluster.node.gpus
    for tp in divisors(per_node):
        for cp in context:
            if tp * cp > per_node or world % (tp * cp) or w.seq_len % (2 * cp):
                continue
            for pp in (p for p in divisors(world // (tp * cp)) if w.layers % p == 0):
                if cp > 1 and pp > 1:
                    continue
                data = world // (tp * pp * cp)
                for ep in (e for e in divisors(data) if e == 1 or (w.experts % e == 0
                                                                   and w.experts)):
                    for sdp in divisors(data // ep):
                        dp = data // (ep * sdp)
                        if global_batch % (dp * ep * sdp) == 0 and _divides(
                                w, dp, sdp, tp, pp, cp, ep):
                            yield dp, ep, sdp, tp, pp, cp


def _divides(w: Workload, dp: int, sdp: int, tp: int, pp: int, cp: int = 1,
             ep: int = 1) -> bool:
    """Megatron splits whole heads over tp, every parameter must divide, and ring
    attention (cp the heads do not allow ulysses for) runs its blocks in XLA."""
    if w.heads % tp or w.kv_heads % tp:
        return False
    if cp > 1 and w.context_strategy(cp, tp) == "ring" and getattr(
            w.config, "attention_impl", "auto") not in RING_IMPLS:
        return False
    try:
        _shards(w, dp, sdp, tp, pp, cp, ep)
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=4096)
def _shards(w: Workload, dp: int, sdp: int, tp: int, pp: int, cp: int, ep: int = 1):
    return w.shards({"dp": dp, "pp": pp, "ep": ep, "sdp": sdp, "cp": cp, "tp": tp})


def _schedules(w: Workload, pp: int, microbatches: int, schedules: Sequence[str]):
    if pp == 1:
        yield "simple", 1
        return
    for name in schedules:
        if name != "simple" and microbatches < pp:
            continue
        if name == "virtual":
            yield from ((name, v) for v in VIRTUAL_CHUNKS if w.layers % (pp * v) == 0)
        else:
            yield name, 1


def evaluate(w: Workload, c: Candidate, cluster: Cluster,
             semantics: Semantics = TARGET, fitted: Fitted = FITTED) -> Plan:
    cluster.node.gpu.check_precision(c.precision)
    memory = estimate_memory(w, c, semantics)
    step = estimate_time(w, c, cluster, semantics, fitted)
    return Plan(c, memory, step, throughput(w, c, cluster, step, semantics),
                capacity(cluster.node.gpu.memory_bytes))


def plan(model_config: Any, cluster: Cluster, *, seq_len: int, global_batch: int,
         precision: str = "bf16", top: int | None = 10, semantics: Semantics = TARGET,
         remats: Sequence[str] = POLICIES, schedules: Sequence[str] = SCHEDULES,
         include_unfit: bool = False, reduce_dtype: str | None = None) -> list[Plan]:
    """Ranked plans for training ``model_config`` on ``cluster``: the configurations that
    fit in memory, fastest first (``include_unfit``: then the others, smallest first).
    ``reduce_dtype``: the gradient reduction's dtype, ``fp32`` or ``bf16``; ``None`` takes
    the step's default (``bf16`` with ``precision="bf16"``, else ``fp32``)."""
    positive_int("global_batch", global_batch)
    if reduce_dtype is not None and reduce_dtype not in REDUCE_DTYPES:
        raise ValueError(f"unknown reduce_dtype {reduce_dtype!r}; valid: "
                         f"{tuple(REDUCE_DTYPES)} or None (the step's default)")
    cluster.node.gpu.check_precision(precision)
    config = load_model(model_config)
    w = _workload(config, seq_len)
    def every(context: Sequence[int] | None) -> list[Plan]:
        return [evaluate(w, c, cluster, semantics) for c in
                candidates(w, cluster, global_batch, precision, remats, schedules,
                           context=context, reduce_dtype=reduce_dtype)]
    plans = every(None)
    if w.seq_len < LONG_SEQUENCE and not w.experts and not any(p.fits for p in plans):
        plans += every(CONTEXT_DEGREES[1:])   # a short sequence split as a last resort
    if not plans:
        raise ValueError(f"no (dp, ep, sdp, tp, pp, cp, microbatch) divides {cluster.world} GPUs, "
                         f"global batch {global_batch} and the model's {w.layers} layers; "
                         f"choose a global batch divisible by more data-parallel degrees")
    fitting = sorted((p for p in plans if p.fits), key=lambda p: p.throughput.step_seconds)
    ranked = fitting + (sorted((p for p in plans if not p.fits), key=lambda p: p.memory.total)
                        if include_unfit else [])
    return ranked if top is None else ranked[:top]


@functools.lru_cache(maxsize=16)
def _workload(config: Any, seq_len: int) -> Workload:
    return Workload(config, seq_len)
