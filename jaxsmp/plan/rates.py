"""What a step time means to the user: tokens/s, model and hardware TFLOP/s per GPU, and
MFU, from :func:`jaxsmp.plan.throughput.estimate_time`'s step."""
from __future__ import annotations

from dataclasses import dataclass

from jaxsmp.plan import moe
from jaxsmp.plan.candidate import Candidate
from jaxsmp.plan.hardware import Cluster
from jaxsmp.plan.throughput import StepTime
from jaxsmp.plan.workload import Workload


@dataclass(frozen=True)
class Throughput:
    step_seconds: float
    tokens_per_second: float
    model_tflops_per_gpu: float      # 6N + attention per token (PaLM), active parameters
    hardware_tflops_per_gpu: float   # FLOPs executed: recomputation, masked expert GEMMs
    mfu: float


def throughput(w: Workload, c: Candidate, cluster: Cluster, step: StepTime) -> Throughput:
    tokens = c.global_batch * w.seq_len
    seconds = step.total
    model = w.model_flops_per_token * tokens / seconds / cluster.world
    extra = {"none": 0.0, "full": 1 / 3, "save_qkv": 1 / 3}.get(c.remat, 0.0)
    if c.pp > 1 and c.schedule == "interleaved":
        extra += 1 / 3
    layer_share = 1 - 6 * w.hidden * w.vocab / w.model_flops_per_token
    hardware = model * (1 + extra * layer_share) + _expert_excess(w, c) * (1 + extra) * (
        tokens / seconds / cluster.world)
    if c.remat == "save_qkv":   # its q, k, v projections are not recomputed
        hardware -= 2 * w.layers * w.layer_qkv_params * tokens / seconds / cluster.world
    return Throughput(seconds, tokens / seconds, model / 1e12, hardware / 1e12,
                      model / cluster.node.gpu.flops(c.precision))


def _expert_excess(w: Workload, c: Candidate) -> float:
    """Expert FLOPs per token run beyond the active ones (forward and backward): a
    mixture's masked GEMMs and padded dispatch rows (:mod:`jaxsmp.plan.moe`)."""
    if not w.experts:
        return 0.0
    tokens = c.microbatch_size * w.seq_len
    run = moe.expert_flops(w, c, tokens, 1) - moe.active_flops(w, tokens)
    return 3 * w.layers * run / tokens
