"""Step time of one candidate on a cluster: compute, collectives, pipeline bubble.

Per microbatch and layer a device runs its matmuls (roofline: FLOPs at the achievable
matmul rate, or their bytes at HBM bandwidth), FlashAttention (executed causal FLOPs at
its rate) and memory-bound work (the layer's activation traffic, scaled per family to
what the compiled program moves, :mod:`jaxsmp.plan.calibration`); collectives come from
:class:`collectives.CostModel` on the mesh axis' topology plus a launch cost per call.
Prefetched ZeRO-3 collectives hide behind ``overlap`` of the compute beside them, which
runs on the SMs NCCL's kernels leave it (``GPU.collective_sm_share``); the first gather
and the last reduce-scatter of each microbatch have nothing to hide behind.
See :mod:`jaxsmp.plan` for the assumptions and their sources.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from jaxsmp.pipeline.partition import balanced_counts
from jaxsmp.pipeline.timing import fused_seconds, one_f_one_b_seconds, one_f_one_b_split
from jaxsmp.plan import moe, traffic
from jaxsmp.plan.activation_gather import planned
from jaxsmp.plan.calibration import (
    FITTED,
    FP8_QUANTISE_BYTES,
    HBM_EFFICIENCY,
    STRAGGLER_SPREAD,
    Fitted,
)
from jaxsmp.plan.candidate import TARGET, Candidate, Semantics, schedule_report
from jaxsmp.plan.comm import (
    all_reduce_seconds,
    context_transfers,
    gather_seconds,
    stage_send_seconds,
)
from jaxsmp.plan.hardware import Cluster
from jaxsmp.plan.workload import Workload, backward_ratio


@dataclass(frozen=True)
class StepTime:
    """Seconds per step on the critical path of one device."""
    compute: float       # matmuls, attention, memory-bound work, recomputation
    sdp: float           # sdp gathers / reduce-scatters not hidden behind compute
    tp: float            # tensor-parallel all-reduces
    cp: float            # context-parallel attention transfers not hidden behind compute
    pp: float            # pipeline point-to-point transfers
    bubble: float        # pipeline idle time
    dp: float            # gradient all-reduce over dp
    optimizer: float
    offload: float       # host transfers not hidden behind compute
    ep: float = 0.0      # a mixture of experts' all-to-alls over ep (exposed)
    contention: float = 0.0  # compute slowed by the SMs hidden sdp collectives hold
    stragglers: float = 0.0  # waiting for the slowest of the cluster's GPUs
    stages: tuple[int, ...] = ()  # layers per (virtual) pipeline stage, as the step splits
    spread_head: bool = False     # 1F1B runs the head on every stage (pipeline_head)

    @property
    def total(self) -> float:
        return sum(v for k, v in asdict(self).items() if k not in ("stages", "spread_head"))


@dataclass(frozen=True)
class _Layer:
    """One layer, one microbatch, one device: seconds of forward and backward compute
    (recomputation included) and of sdp collectives."""
    forward: float
    backward: float
    recompute: float
    gather: float
    reduce_scatter: float
    tp: float
    offload: float
    cp: float = 0.0
    ep: float = 0.0


def _kernels(w: Workload, c: Candidate, cluster: Cluster, split: int,
             fitted: Fitted) -> tuple[float, float]:
    """Seconds of one layer's forward GEMMs (roofline: FLOPs at the achievable rate, or
    their operands' bytes at HBM's) and of its forward FlashAttention (executed causal
    FLOPs at its kernel's rate), one microbatch on one device."""
    gpu, hbm = cluster.node.gpu, cluster.node.gpu.hbm_bandwidth * HBM_EFFICIENCY
    tokens = c.microbatch_size * w.seq_len // c.cp
    linear = gpu.linear_flops(c.precision)    # float8 GEMMs with "fp8"; attention stays
    matmul = max(moe.layer_matmul_flops(w, c, tokens, split)
                 / (linear * gpu.matmul_efficiency * fitted.matmul),
                 c.compute_bytes * traffic.gemm_elements(w, c, tokens, split) / hbm)
    causal_flops = 4 * tokens * w.seq_len * w.hidden / split * 0.5
    kernel = w.attention_kernel_at(c.precision)
    rate = gpu.flops(c.precision) * gpu.attention_share(kernel) * fitted.attention
    return matmul, causal_flops / rate


def _layer(w: Workload, c: Candidate, cluster: Cluster, semantics: Semantics,
           fitted: Fitted) -> _Layer:
    hbm = cluster.node.gpu.hbm_bandwidth * HBM_EFFICIENCY
    cbytes = c.compute_bytes
    tokens = c.microbatch_size * w.seq_len // c.cp    # one microbatch, one device
    split = c.tp if semantics.megatron_tp else 1    # else every tp rank runs the whole layer
    matmul, attention = _kernels(w, c, cluster, split, fitted)
    if c.precision == "fp8":   # each GEMM's operands cast to float8, their amax, transposes
        matmul += FP8_QUANTISE_BYTES * traffic.gemm_elements(w, c, tokens, split) / hbm
    kernel = w.attention_kernel_at(c.precision)
    elementwise = traffic.elementwise(w, c, cluster, split) * w.memory_scale.layer
    weights = traffic.weights(w, c, cluster, split) * w.memory_scale.weights
    forward = matmul + attention + elementwise + traffic.stash(w, c, cluster, split)
    backward = (2 * matmul + backward_ratio(kernel) * attention
                + (traffic.ELEMENTWISE_PASSES - 1) * elementwise + weights)
    # the GEMMs the policy runs again (never the projections only the residual sum reads,
    # nor what it saves: jaxsmp.plan.recompute) and attention; a stack that reruns the
    # whole forward eagerly (Semantics.whole_forward) runs its elementwise kernels again
    recompute = 0.0 if c.remat == "none" else (
        matmul * semantics.recomputed_share(w, c.remat) + attention
        + elementwise * semantics.whole_forward)
    if c.pp > 1 and c.schedule == "interleaved":
        recompute += forward        # 1F1B's backward recomputes its stage
    shards, zero = w.shards(c.mesh_shape), c.sdp * c.cp    # ZeRO-3 over sdp x cp
    split_gemms = planned(w, c, tokens, cbytes)   # weights kept split, activations moved
    per_layer = (shards.layer_gathered - split_gemms.layer_weights) * c.tp / split / zero
    gather = gather_seconds(cluster, zero, c.tp, cbytes * per_layer)
    # the gradient travels in the candidate's reduce_dtype (float32 or bf16)
    reduce_scatter = gather_seconds(cluster, zero, c.tp, c.reduce_bytes * per_layer)
    if not semantics.keeps_gathered(c.remat):
        reduce_scatter += gather    # gathered again for the backward pass
    moved = split_gemms.seconds(cluster, c)   # forward and backward alike, roughly
    gather, reduce_scatter = gather + moved / 2, reduce_scatter + moved / 2
    reductions = 4 if c.remat == "none" else 6   # 2 per Megatron layer pass
    tp = reductions * all_reduce_seconds(cluster, split, 1, tokens * w.hidden * cbytes)
    host = w.activations(c.remat, c.precision).host / split * tokens
    offload = 2 * host / cluster.node.pcie_bandwidth
    cp_forward, cp_backward = context_transfers(w, c, cluster, split, attention)
    cp = cp_forward * (2 if c.remat != "none" else 1) + cp_backward  # recompute: again
    ep = moe.exchange_seconds(w, c, cluster, tokens, cbytes)
    return _Layer(forward, backward, recompute, gather, reduce_scatter, tp, offload, cp, ep)


def _overlapped(layer: _Layer, semantics: Semantics,
                overlap: float) -> tuple[float, float, float]:
    """(compute, exposed sdp collectives, exposed offload) of one layer: with prefetch
    the next layer's gather runs under ``overlap`` of this layer's compute (and in the
    backward the re-gather and the reduce-scatter under the backward's)."""
    compute = layer.forward + layer.backward + layer.recompute
    comm = layer.gather + layer.reduce_scatter
    if semantics.prefetch:
        exposed = (max(0.0, layer.gather - overlap * layer.forward)
                   + max(0.0, layer.reduce_scatter
                         - overlap * (layer.backward + layer.recompute)))
    else:
        exposed = comm
    return compute, exposed, max(0.0, layer.offload - compute)


def _contention(layer: _Layer, compute: float, exposed: float, share: float) -> float:
    """Seconds the compute of one layer loses to the sdp collectives it hides: while one
    runs, NCCL's thread blocks hold ``share`` of the SMs (they never share one with a
    compute kernel), so the compute beside it runs ``share`` slower for that long."""
    return share * min(layer.gather + layer.reduce_scatter - exposed, compute)


def _per_layer(layer: _Layer, semantics: Semantics, overlap: float,
               share: float) -> tuple[float, float, float, float, float]:
    """One layer of one microbatch on the critical path: (its seconds in all, compute,
    exposed sdp collectives, compute lost to the hidden ones, exposed offload)."""
    compute, exposed, offload = _overlapped(layer, semantics, overlap)
    contention = _contention(layer, compute, exposed, share)
    total = compute + exposed + contention + layer.tp + layer.cp + layer.ep + offload
    return total, compute, exposed, contention, offload


def _edges(layer: _Layer, overlap: float) -> float:
    """What the per-layer overlap hid of the first gather and the last reduce-scatter of
    a microbatch, which have no compute beside them."""
    return (min(layer.gather, overlap * layer.forward)
            + min(layer.reduce_scatter, overlap * (layer.backward + layer.recompute)))


def _head(w: Workload, c: Candidate, cluster: Cluster, fitted: Fitted) -> float:
    """The output head and loss of one microbatch: 3 matmuls of d x vocab/tp per token
    and the logits (compute dtype) moved a few times; on 1/cp of the tokens when tp = 1
    (with tp > 1 the head runs on the whole sequence, :mod:`jaxsmp.context.sequence`)."""
    return _head_gemms(w, c, cluster, fitted) + traffic.head_memory(w, c, cluster) * (
        w.memory_scale.outside)


def _head_gemms(w: Workload, c: Candidate, cluster: Cluster, fitted: Fitted) -> float:
    gpu = cluster.node.gpu
    tokens = c.microbatch_size * w.seq_len // (c.cp if c.tp == 1 else 1)
    flops = 6 * w.hidden * w.vocab / c.tp * tokens
    return flops / (gpu.flops(c.precision) * gpu.matmul_efficiency * fitted.matmul)


def kernel_seconds(w: Workload, c: Candidate, cluster: Cluster, semantics: Semantics = TARGET,
                   fitted: Fitted = FITTED) -> tuple[float, float]:
    """(GEMMs, attention): the seconds of one step on one device that
    :func:`estimate_time` gives its GEMMs (the head's included, fp8's casts not) and its
    FlashAttention kernels, forward, backward and recomputed; the rest of the step is
    memory-bound work, collectives and the optimizer. A profiler's trace splits a step
    the same way (``bench/plan_vs_measured.py --trace``). ``pp`` = 1 only."""
    if c.pp != 1:
        raise ValueError(f"kernel_seconds prices a step with every layer on the device "
                         f"(pp=1); {c.label()} has pp={c.pp}")
    matmul, attention = _kernels(w, c, cluster, c.tp if semantics.megatron_tp else 1, fitted)
    again = c.remat != "none"
    gemms = 3 + (semantics.recomputed_share(w, c.remat) if again else 0.0)
    attentions = 1 + backward_ratio(w.attention_kernel_at(c.precision)) + again
    return (c.microbatches * (w.layers * gemms * matmul + _head_gemms(w, c, cluster, fitted)),
            c.microbatches * w.layers * attentions * attention)


def _bubble(c: Candidate) -> float:
    if c.pp == 1:
        return 0.0
    return schedule_report(c.schedule, c.pp, c.microbatches, c.virtual_chunks).bubble


def estimate_time(w: Workload, c: Candidate, cluster: Cluster,
                  semantics: Semantics = TARGET, fitted: Fitted = FITTED) -> StepTime:
    """Step time of ``c`` on ``cluster`` (its ``world`` must equal the candidate's);
    ``fitted``: the kernel-rate and overlap constants (:mod:`jaxsmp.plan.calibration`)."""
    if c.world != cluster.world:
        raise ValueError(f"candidate {c.label()} uses {c.world} devices; the cluster has "
                         f"{cluster.world}")
    layer = _layer(w, c, cluster, semantics, fitted)
    edges = _edges(layer, fitted.overlap) if semantics.prefetch else 0.0
    share = cluster.node.gpu.collective_sm_share
    per_layer, compute, exposed, contention, offload = _per_layer(
        layer, semantics, fitted.overlap, share)
    m = c.microbatches
    head = _head(w, c, cluster, fitted)
    split, spread = _stage_split(w, c, layer, per_layer, head)
    layers, head_here, busy = _busiest(c, split, per_layer, head, w.layers, spread)
    # the edges were counted hidden (and contending) in each layer; they are exposed
    per_microbatch = layers * per_layer + edges - share * edges
    shards = w.shards(c.mesh_shape)
    cbytes = c.compute_bytes
    zero = c.sdp * c.cp
    tokens = c.microbatch_size * w.seq_len // c.cp
    split_gemms = planned(w, c, tokens, cbytes)
    gathered = shards.top_gathered - split_gemms.top_weights
    top = (gather_seconds(cluster, zero, c.tp, cbytes * gathered / zero)
           + gather_seconds(cluster, zero, c.tp, c.reduce_bytes * gathered / zero)
           + split_gemms.seconds(cluster, c, top=True))
    sends = 2 * c.virtual_chunks * stage_send_seconds(cluster, c, tokens * w.hidden * cbytes)
    pipeline = m * per_microbatch
    bubble = (pipeline + m * sends) * _bubble(c)
    if c.pp > 1 and c.schedule == "interleaved":  # the head runs in the last stage's ticks
        bubble = max(0.0, _lockstep(c, split, layer, per_layer, head, spread) - m * busy)
    step = StepTime(
        compute=m * layers * compute + m * head * head_here,
        sdp=m * (layers * exposed + edges + top),
        tp=m * layers * layer.tp,
        pp=m * sends,
        bubble=bubble,
        dp=_replica_reduction(c, cluster, shards),
        optimizer=traffic.optimizer(w, c, cluster) * w.memory_scale.outside,
        offload=m * layers * offload,
        cp=m * layers * layer.cp, ep=m * layers * layer.ep,
        contention=m * (layers * contention - share * edges), stages=split,
        spread_head=spread)
    return replace(step, stragglers=step.total * straggler_wait(cluster.world))


def straggler_wait(world: int) -> float:
    """The share of a step that ``world`` GPUs wait for their slowest one, the expected
    maximum of ``world`` normal speeds (:data:`~jaxsmp.plan.calibration.STRAGGLER_SPREAD`)."""
    return STRAGGLER_SPREAD * math.sqrt(2 * math.log(world)) if world > 1 else 0.0


def _replica_reduction(c: Candidate, cluster: Cluster, shards) -> float:
    """The gradient all-reduce over the replicas: the dense parameters' over dp x ep
    (``ep`` is a data-replica axis for them), the experts' over dp only (each ep group
    owns its experts). dp and ep are adjacent in the device order only with pp = 1;
    the group is priced at ep's stride either way."""
    dense = shards.local - shards.expert_local
    stride = c.sdp * c.cp * c.tp
    return (all_reduce_seconds(cluster, c.dp * c.ep, stride, c.reduce_bytes * dense)
            + all_reduce_seconds(cluster, c.dp, c.pp * c.ep * stride,
                                 c.reduce_bytes * shards.expert_local))


def _forward_share(layer: _Layer) -> float:
    return layer.forward / (layer.forward + layer.backward + layer.recompute)


def _stage_split(w: Workload, c: Candidate, layer: _Layer, per_layer: float,
                 head: float) -> tuple[tuple[int, ...], bool]:
    """(layers per (virtual) stage, head spread) as ``pipeline_partition="auto"`` and
    ``pipeline_head="auto"`` choose: for 1F1B the split and head placement fastest in
    lock-step; the most even split for the other schedules (their head runs outside
    the ticks)."""
    if c.pp == 1:
        return (), False
    parts = c.pp * c.virtual_chunks
    if w.layers < parts:
        raise ValueError(f"{c.label()} needs at least pp x chunks = {parts} layers; the "
                         f"model has {w.layers}")
    if c.schedule != "interleaved":
        if w.layers % parts == 0:
            return (w.layers // parts,) * parts, False
        return balanced_counts([1.0] * w.layers, parts), False
    forward = per_layer * _forward_share(layer)
    split = one_f_one_b_split(w.layers, c.pp, c.microbatches, forward, per_layer - forward,
                              head, can_spread=c.microbatch_size % c.pp == 0,
                              fused=c.tp > 1)
    return split.counts, split.spread_head


def _busiest(c: Candidate, split: tuple[int, ...], per_layer: float, head: float,
             num_layers: int, spread: bool = False) -> tuple[int, float, float]:
    """(layers, the share of the head it runs, seconds per microbatch) of the busiest
    stage."""
    if not split:
        return num_layers, 1, num_layers * per_layer + head
    layers = [sum(split[s::c.pp]) for s in range(c.pp)]
    inside = c.schedule == "interleaved"   # else every stage runs the head, outside
    shares = [(1 / c.pp if spread else float(s == c.pp - 1)) if inside else 1.0
              for s in range(c.pp)]
    loads = [n * per_layer + share * head for n, share in zip(layers, shares)]
    s = max(range(c.pp), key=loads.__getitem__)
    return layers[s], shares[s], loads[s]


def _lockstep(c: Candidate, split: tuple[int, ...], layer: _Layer, per_layer: float,
              head: float, spread: bool = False) -> float:
    """Seconds of the 1F1B ticks, every tick as long as its slowest stage's op (under
    ``tp`` the step's fused ticks, :mod:`jaxsmp.pipeline.fused_ticks`)."""
    forward = per_layer * _forward_share(layer)
    timing = fused_seconds if c.tp > 1 else one_f_one_b_seconds
    return timing(split, c.microbatches, forward, per_layer - forward, head,
                  spread_head=spread)
