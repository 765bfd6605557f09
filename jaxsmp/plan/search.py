"""Every configuration that divides the cluster and the global batch, ranked."""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from jaxsmp.models.registry import preset
from jaxsmp.nn.remat import POLICIES
from jaxsmp.pipeline.schedule import SCHEDULES
from jaxsmp.plan.candidate import TARGET, Candidate, Semantics
from jaxsmp.plan.hardware import Cluster
from jaxsmp.plan.memory import MemoryBreakdown, capacity, estimate_memory
from jaxsmp.plan.throughput import StepTime, Throughput, estimate_time, throughput
from jaxsmp.plan.workload import Workload

GiB = 1 << 30
VIRTUAL_CHUNKS = (2,)   # chunks per stage the search tries for the virtual schedule


@dataclass(frozen=True)
class Plan:
    """One candidate with its predicted memory, step time and throughput."""
    candidate: Candidate
    memory: MemoryBreakdown
    time: StepTime
    throughput: Throughput
    capacity: float

    @property
    def fits(self) -> bool:
        return bool(self.memory.total <= self.capacity)

    def as_dict(self) -> dict:
        c, t = self.candidate, self.throughput
        return {**c.as_dict(), "memory_gib_per_gpu": self.memory.total / GiB,
                "capacity_gib_per_gpu": self.capacity / GiB,
                "memory_breakdown_gib": self.memory.as_gib(), "memory_peak_at": self.memory.phase,
                "step_seconds": t.step_seconds, "time_breakdown_seconds": vars(self.time),
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
               sequence_parallel: bool = False) -> Iterator[Candidate]:
    """Every (dp, sdp, tp, pp, microbatch, remat, schedule) dividing the cluster, the
    global batch and the model (whole heads per tp rank); tp stays inside a node."""
    world = cluster.world
    for tp in divisors(cluster.node.gpus):
        for pp in (p for p in divisors(world // tp) if w.layers % p == 0):
            for sdp in divisors(world // (tp * pp)):
                dp = world // (tp * pp * sdp)
                if global_batch % (dp * sdp) or not _divides(w, dp, sdp, tp, pp):
                    continue
                local = global_batch // (dp * sdp)
                for mbs in divisors(local):
                    for remat in remats:
                        for schedule, chunks in _schedules(w, pp, local // mbs, schedules):
                            yield Candidate(dp, sdp, tp, pp, mbs, local // mbs, remat,
                                            precision, schedule, chunks, sequence_parallel)


def _divides(w: Workload, dp: int, sdp: int, tp: int, pp: int) -> bool:
    """Megatron splits whole heads over tp, and every parameter must divide."""
    if w.heads % tp or w.kv_heads % tp:
        return False
    try:
        _shards(w, dp, sdp, tp, pp)
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=4096)
def _shards(w: Workload, dp: int, sdp: int, tp: int, pp: int):
    return w.shards({"dp": dp, "pp": pp, "sdp": sdp, "tp": tp})


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
             semantics: Semantics = TARGET) -> Plan:
    memory = estimate_memory(w, c, semantics)
    step = estimate_time(w, c, cluster, semantics)
    return Plan(c, memory, step, throughput(w, c, cluster, step),
                capacity(cluster.node.gpu.memory_bytes))


def plan(model_config: Any, cluster: Cluster, *, seq_len: int, global_batch: int,
         precision: str = "bf16", top: int | None = 10, semantics: Semantics = TARGET,
         remats: Sequence[str] = POLICIES, schedules: Sequence[str] = SCHEDULES,
         include_unfit: bool = False) -> list[Plan]:
    """Ranked plans for training ``model_config`` on ``cluster``: the configurations that
    fit in memory, fastest first (``include_unfit``: then the others, smallest first)."""
    if not isinstance(global_batch, int) or global_batch < 1:
        raise ValueError(f"global_batch must be a positive integer, got {global_batch!r}")
    w = _workload(load_model(model_config), seq_len)
    plans = [evaluate(w, c, cluster, semantics)
             for c in candidates(w, cluster, global_batch, precision, remats, schedules)]
    if not plans:
        raise ValueError(f"no (dp, sdp, tp, pp, microbatch) divides {cluster.world} GPUs, "
                         f"global batch {global_batch} and the model's {w.layers} layers; "
                         f"choose a global batch divisible by more data-parallel degrees")
    fitting = sorted((p for p in plans if p.fits), key=lambda p: p.throughput.step_seconds)
    ranked = fitting + (sorted((p for p in plans if not p.fits), key=lambda p: p.memory.total)
                        if include_unfit else [])
    return ranked if top is None else ranked[:top]


@functools.lru_cache(maxsize=16)
def _workload(config: Any, seq_len: int) -> Workload:
    return Workload(config, seq_len)
