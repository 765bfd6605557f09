"""What a step time means to the user: tokens/s, model and hardware TFLOP/s per GPU, and
MFU, from :func:`jaxsmp.plan.throughput.estimate_time`'s step."""
from __future__ import annotations

from dataclasses import dataclass

from jaxsmp.plan import moe
from jaxsmp.plan.candidate import TARGET, Candidate, Semantics
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


def throughput(w: Workload, c: Candidate, cluster: Cluster, step: StepTime,
               semantics: Semantics = TARGET) -> Throughput:
    tokens = c.global_batch * w.seq_len
    seconds = step.total
    model = w.model_flops_per_token * tokens / seconds / cluster.world
    # run again: the policy's share of the layers' forward GEMMs (jaxsmp.plan.recompute)
    # and attention's forward (PaLM's 4 x layers x width x seq a token); 1F1B: the stage
    layers = (w.model_flops_per_token - 6 * w.hidden * w.vocab) / 3
    attention = 4 * w.layers * w.hidden * w.seq_len
    extra = (0.0 if c.remat == "none" else
             semantics.recomputed_share(w, c.remat) * (layers - attention) + attention)
    if c.pp > 1 and c.schedule == "interleaved":
        extra += layers
    share = extra / (3 * layers)
    hardware = model + (extra + _expert_excess(w, c) * (1 + share)) * (
        tokens / seconds / cluster.world)
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
