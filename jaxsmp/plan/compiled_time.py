"""The compiled step's time: :mod:`jaxsmp.plan.hlo_cost` on XLA:GPU's program, with the
planner's rates and its collectives priced on the cluster's topology.

This is the slow, faithful estimate (a deviceless compile, seconds to minutes); the
search uses the analytic model, whose memory-bound constants come from here
(:mod:`jaxsmp.plan.calibrate`), and the GPU pre-flight prints both.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jaxsmp.plan.calibration import FITTED, HBM_EFFICIENCY, Fitted
from jaxsmp.plan.comm import all_reduce_seconds, axis_cost, gather_seconds
from jaxsmp.plan.hardware import GPU, Cluster
from jaxsmp.plan.hlo_cost import Collective, KernelTime, Rates, estimate


def rates(gpu: GPU, precision: str, fitted: Fitted = FITTED) -> Rates:
    """The rates the analytic model charges on ``gpu``: matmuls at the achievable
    fraction, cuDNN's and Pallas's fused attention at theirs (all times the fitted
    constants), HBM at ``HBM_EFFICIENCY`` of the data sheet; with ``"fp8"`` its FP8 GEMMs
    at the float8 peak."""
    peak = gpu.flops(precision)
    fp8 = gpu.linear_flops(precision) if precision == "fp8" else 0.0
    return Rates(peak * gpu.matmul_efficiency * fitted.matmul,
                 peak * gpu.attention_share("cudnn") * fitted.attention,
                 gpu.hbm_bandwidth * HBM_EFFICIENCY,
                 fp8 * gpu.matmul_efficiency * fitted.matmul,
                 peak * gpu.attention_share("pallas") * fitted.attention)


def collective_seconds(c: Collective, cluster: Cluster) -> float:
    """One collective of the compiled program on the cluster's topology, ``count`` times."""
    if c.group_size == 1:
        return 0.0
    if c.kind in ("all-gather", "reduce-scatter"):
        one = gather_seconds(cluster, c.group_size, c.stride, c.nbytes / c.group_size)
    elif c.kind == "all-reduce":
        one = all_reduce_seconds(cluster, c.group_size, c.stride, c.nbytes)
    else:   # collective-permute, all-to-all, send/recv: each device sends its buffer
        topo, model = axis_cost(cluster, c.group_size, c.stride)
        share = (c.group_size - 1) / c.group_size if c.kind == "all-to-all" else 1.0
        one = model.send(c.nbytes * share, across_hosts=topo.hosts > 1)
    return one * c.count


@dataclass(frozen=True)
class CompiledTime:
    """Per-device seconds of one step of the compiled program: its kernels, and its
    collectives one after another (none hidden)."""
    kernels: KernelTime
    collectives: float

    def summary(self, predicted: Any = None) -> str:
        k = self.kernels
        lines = [f"  time (roofline over XLA:GPU's program): compute {k.compute:.3f} s = "
                 f"matmul {k.matmul:.3f} + attention {k.attention:.3f} + memory-bound "
                 f"{k.memory:.3f} + launches {k.launch:.3f}; collectives {self.collectives:.3f}"
                 f" s if none overlapped"]
        if predicted is not None:
            compute = predicted.compute + predicted.optimizer
            lines.append(f"  time (analytic model): compute {compute:.3f} s "
                         f"({compute / k.compute - 1:+.1%}), step {predicted.total:.3f} s "
                         f"with exposed collectives and bubble")
        return "\n".join(lines)


def compiled_time(compiled: Any, gpu: GPU, precision: str, cluster: Cluster,
                  fitted: Fitted = FITTED) -> CompiledTime:
    """The time of ``compiled`` (an XLA:GPU executable of one step) on ``cluster``."""
    kernels = estimate(compiled.as_text(), rates(gpu, precision, fitted))
    return CompiledTime(kernels, sum(collective_seconds(c, cluster)
                                     for c in kernels.collectives))
