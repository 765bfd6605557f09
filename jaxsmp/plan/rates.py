"""What a step time means to the user: tokens/s, model and hardware TFLOP/s per GPU, and
MFU, from :func:`jaxsmp.plan.throughput.estimate_time`'s step."""
from __future__ import annotations

from dataclasses import dataclass

from jaxsmp.plan.candidate import Candidate
from jaxsmp.plan.hardware import Cluster
from jaxsmp.plan.throughput import StepTime
from jaxsmp.plan.workload import Workload


@dataclass(frozen=True)
class Throughput:
    step_seconds: float
    tokens_per_second: float
    model_tflops_per_gpu: float      # 6N + attention per token (PaLM), no recomputation
    hardware_tflops_per_gpu: float   # FLOPs executed, recomputation included
    mfu: float


def throughput(w: Workload, c: Candidate, cluster: Cluster, step: StepTime) -> Throughput:
    tokens = c.global_batch * w.seq_len
    seconds = step.total
    model = w.model_flops_per_token * tokens / seconds / cluster.world
    extra = {"none": 0.0, "full": 1 / 3}.get(c.remat, 0.0)
    if c.pp > 1 and c.schedule == "interleaved":
        extra += 1 / 3
    layer_share = 1 - 6 * w.hidden * w.vocab / w.model_flops_per_token
    hardware = model * (1 + extra * layer_share)
    return Throughput(seconds, tokens / seconds, model / 1e12, hardware / 1e12,
                      model / cluster.node.gpu.flops(c.precision))
