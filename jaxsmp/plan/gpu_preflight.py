"""Pre-flight on the real compiler: the plan's step compiled by XLA:GPU for the plan's
GPUs on this host, deviceless (:mod:`jaxsmp.plan.gpu_target`), at full size.

Nothing is scaled: the step is one SPMD program whatever the device count, so a
topology of ``hosts x 8`` abstract GPUs costs the compiler about what 8 do (the layers are
one scan, so depth costs little too). XLA's per-device arguments, temporaries and host
memory are printed beside the memory model's prediction for the GPU and the GPU's
capacity; a deviceless compile never runs out of memory by itself, so "does not fit"
is stated when the compiled total exceeds the capacity. The temporaries are shown
against XLA's limit (:func:`jaxsmp.plan.memory.temporaries_limit`), and near it the step
is compiled again without XLA's rematerialization pass, to say what XLA recomputed
(GEMM FLOPs beyond that program's) and the memory the recompute saved.
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass, replace
from typing import Any

from jaxsmp import xla_flags
from jaxsmp.plan.candidate import TARGET, Candidate, Semantics
from jaxsmp.plan.compiled import CompiledMemory, GiB, compile_candidate, memory_of
from jaxsmp.plan.compiled_time import CompiledTime, compiled_time, rates
from jaxsmp.plan.gpu_target import count_fp8_gemms
from jaxsmp.plan.hardware import Cluster
from jaxsmp.plan.hlo_cost import estimate
from jaxsmp.plan.memory import (
    FRAMEWORK_BYTES,
    MemoryBreakdown,
    capacity,
    estimate_memory,
    temporaries_limit,
)
from jaxsmp.plan.throughput import StepTime, estimate_time
from jaxsmp.plan.workload import Workload

# compiled temporaries from this fraction of XLA's limit up: compiled again without its
# rematerialization pass, to say what it recomputed
NEAR_LIMIT = 0.8
NO_REMAT = {"xla_disable_hlo_passes": "rematerialization"}
FLAGS_SET = "  compiled with the overlap flags jaxsmp gives XLA on GPU hosts, as a GPU runs it"
FLAGS_MISSING = ("  compiled WITHOUT the overlap flags jaxsmp gives XLA on GPU hosts (JAX started "
                 "before they were set, or JAXSMP_XLA_FLAGS=0): jaxsmp's own prefetch is in "
                 "this program, XLA's pipelined gathers in a GPU's; memory and time may "
                 "differ (python -m jaxsmp.plan --preflight sets them)")


@dataclass(frozen=True)
class GpuPreflight:
    candidate: Candidate
    gpu: str
    compiled: CompiledMemory
    predicted: MemoryBreakdown
    capacity: float
    seconds: float
    time: CompiledTime | None = None    # the roofline over the compiled program
    predicted_time: StepTime | None = None   # the analytic model's step
    fp8_gemms: int | None = None   # cuBLASLt FP8 GEMM calls in the program (precision="fp8")
    # compiled with the overlap flags jaxsmp gives XLA on GPU hosts (jaxsmp.xla_flags)
    gpu_flags: bool = True
    combine_bytes: int | None = None   # their collective combine threshold
    # near XLA's limit: (GEMM FLOPs over those of the program compiled without XLA's
    # rematerialization pass, that program's temporaries); None when not compiled
    recomputed: tuple[float, float] | None = None

    @property
    def total(self) -> float:
        """Compiled peak per device plus the CUDA context, workspaces and NCCL buffers
        the model reserves (``FRAMEWORK_BYTES``), which XLA does not see."""
        return self.compiled.peak + FRAMEWORK_BYTES

    @property
    def temporaries_limit(self) -> float:
        """What XLA plans the temporaries within, beside the compiled arguments."""
        return temporaries_limit(self.capacity, self.compiled.arguments)

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    @property
    def error(self) -> float:
        """The model's predicted peak (arguments + temporaries) over XLA:GPU's, minus one."""
        return self.predicted.peak / self.compiled.peak - 1

    def summary(self) -> str:
        c, p = self.compiled, self.predicted
        rows = [("arguments", c.arguments, p.arguments), ("temporaries", c.temporaries,
                                                          p.temporaries),
                ("peak", c.peak, p.peak), ("host (offload)", c.host_temporaries,
                                                         None)]
        lines = [f"pre-flight (XLA:GPU, deviceless): {self.candidate.label()} on "
                 f"{self.candidate.world} x {self.gpu}, compiled in {self.seconds:.0f} s",
                 f"  {'per device':<15} {'compiled GiB':>12} {'model GiB':>10}"]
        lines += [f"  {name:<15} {a / GiB:>12.2f} " + (f"{b / GiB:>10.2f}" if b is not None
                                                       else f"{'':>10}")
                  for name, a, b in rows]
        verdict = "fits" if self.fits else "DOES NOT FIT"
        lines.append(f"  with {FRAMEWORK_BYTES / GiB:.1f} GiB for CUDA/NCCL: "
                     f"{self.total / GiB:.2f} of {self.capacity / GiB:.2f} GiB usable, "
                     f"temporaries {c.temporaries / GiB:.2f} of the "
                     f"{self.temporaries_limit / GiB:.2f} XLA plans them within: {verdict}")
        lines.append(f"  model vs compiled peak: {self.error:+.1%}")
        lines.append(FLAGS_MISSING if not self.gpu_flags else FLAGS_SET + (
            f"; collectives combined up to {self.combine_bytes:,} bytes"
            if self.combine_bytes else ""))
        if self.recomputed is not None:
            lines.append(self._recompute_line())
        if self.fp8_gemms is not None:
            lines.append(f"  fp8: {self.fp8_gemms} cuBLASLt FP8 GEMM calls in the compiled "
                         f"program")
        if self.time is not None:
            lines.append(self.time.summary(self.predicted_time))
        return "\n".join(lines)

    def _recompute_line(self) -> str:
        extra, temporaries = self.recomputed
        line = (f"  XLA recomputes {extra - 1:.1%} more GEMM FLOPs than the step runs without "
                f"its rematerialization pass, whose program needs {temporaries / GiB:.2f} GiB "
                f"of temporaries")
        if extra <= 1.01:
            return line
        total = self.total - self.compiled.temporaries + temporaries
        if total <= self.capacity:
            return (line + f", {total / GiB:.2f} of {self.capacity / GiB:.2f} GiB usable in "
                    f"all: it fits without the recompute, which XLA_FLAGS="
                    f"--xla_disable_hlo_passes=rematerialization leaves out")
        return (line + ": it recomputes to stay within its limit; a smaller microbatch or "
                "more remat may run faster")


def _topology(gpu: str, world: int) -> list:
    from jaxsmp.plan import gpu_target
    per_host = min(world, 8)
    if world % per_host:
        raise ValueError(f"{world} GPUs are not whole hosts of 8")
    return gpu_target.topology(gpu, gpus_per_host=per_host, hosts=world // per_host)


def gpu_preflight(model_config: Any, plan: Any, seq_len: int, gpu: str,
                  semantics: Semantics = TARGET, cluster: Cluster | None = None) -> GpuPreflight:
    """Compiles the training step of ``plan`` (a ``Plan`` or :class:`Candidate`) for
    ``model_config`` with XLA:GPU for ``candidate.world`` GPUs of type ``gpu`` (a key of
    :data:`jaxsmp.plan.gpu_target.TARGETS`) and returns its memory beside the model's,
    and with ``cluster`` (of those GPUs) its time beside the analytic model's."""
    from jaxsmp.plan.hardware import GPUS
    from jaxsmp.plan.search import load_model
    config = load_model(model_config)
    candidate = getattr(plan, "candidate", plan)
    GPUS[gpu].check_precision(candidate.precision)
    devices = _topology(gpu, candidate.world)
    start = time.perf_counter()
    planned = getattr(plan, "time", None)  # the planner's split and head placement
    compile_plan = functools.partial(compile_candidate, config, candidate, seq_len,
                                     devices=devices, stages=getattr(planned, "stages", ()),
                                     spread_head=getattr(planned, "spread_head", None))
    compiled = compile_plan()
    seconds = time.perf_counter() - start
    w = Workload(config, seq_len)
    predicted = estimate_memory(w, candidate, semantics, backend="gpu")
    timed = step = None
    if cluster is not None:
        timed = compiled_time(compiled, GPUS[gpu], candidate.precision, cluster)
        step = estimate_time(w, candidate, cluster, semantics)
    fp8 = count_fp8_gemms(compiled.as_text()) if candidate.precision == "fp8" else None
    result = GpuPreflight(candidate, gpu, memory_of(compiled), predicted,
                          capacity(GPUS[gpu].memory_bytes), seconds, timed, step, fp8,
                          xla_flags.overlap_flags_set(), xla_flags.combine_threshold())
    if result.compiled.temporaries < NEAR_LIMIT * result.temporaries_limit:
        return result
    unlimited = compile_plan(compiler_options=NO_REMAT)
    gemm = lambda c: estimate(c.as_text(), rates(GPUS[gpu], candidate.precision)).matmul_flops
    return replace(result, recomputed=(gemm(compiled) / gemm(unlimited),
                                       memory_of(unlimited).temporaries))
