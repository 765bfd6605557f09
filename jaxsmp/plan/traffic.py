"""HBM traffic of the step's memory-bound work, unscaled: what a layer's activations,
its gathered weights, the residuals a remat policy keeps, the head's logits, the
optimizer and fp8's casts move per step on one device, at ``HBM_EFFICIENCY`` of the
data sheet. :mod:`jaxsmp.plan.calibrate` scales these parts to the compiled program
(:data:`jaxsmp.plan.calibration.MEMORY_SCALE`); :mod:`jaxsmp.plan.throughput` charges
them per layer."""
from __future__ import annotations

from jaxsmp.plan.calibration import HBM_EFFICIENCY
from jaxsmp.plan.candidate import Candidate
from jaxsmp.plan.hardware import Cluster
from jaxsmp.plan.workload import Workload

# Memory-bound work per layer: the forward writes the layer's activations once, the
# backward reads them and writes and reads their gradients (4 passes, whatever the remat
# policy: recomputed elementwise work fuses into the backward's kernels, traced on an
# H100); besides, the residuals a policy keeps are copied into the layer loop's stacked
# buffers (read and written: STASH_PASSES of the bytes kept, unscaled)
ELEMENTWISE_PASSES = 4
STASH_PASSES = 2
ADAMW_BYTES_PER_PARAM = 32   # read params, grads, mu, nu; write params, mu, nu (float32)
# each further microbatch adds its gradient to the float32 total: read both, write one
ACCUMULATE_BYTES_PER_PARAM = 12
# hidden-wide activations a layer's GEMMs read or write per token: the input and q, k, v;
# the attention output in and out; the MLP's input and output (a count across families)
GEMM_ACTIVATION_WIDTHS = 8


def gemm_elements(w: Workload, c: Candidate, tokens: int, split: int) -> float:
    """Elements of one layer's GEMM operands on one device for one microbatch: its
    weights (the experts' over ep) and the hidden-wide activations they read or write."""
    dense = w.layer_matmul_params - w.layer_expert_params
    return ((dense + w.layer_expert_params / c.ep) / split
            + GEMM_ACTIVATION_WIDTHS * tokens * w.hidden)


def fp8_quantise(w: Workload, c: Candidate, cluster: Cluster) -> float:
    """Unscaled seconds of one step's float8 quantisation on one device at 1 byte per
    GEMM operand element and pass, remat none and pp = 1 (3 passes: the forward's GEMMs
    and the backward's two), what :mod:`jaxsmp.plan.calibrate` scales to the compiled
    program (:data:`~jaxsmp.plan.calibration.FP8_QUANTISE_BYTES`)."""
    tokens = c.microbatch_size * w.seq_len // c.cp
    hbm = cluster.node.gpu.hbm_bandwidth * HBM_EFFICIENCY
    return 3 * c.microbatches * w.layers * gemm_elements(w, c, tokens, c.tp) / hbm


def elementwise(w: Workload, c: Candidate, cluster: Cluster, split: int) -> float:
    """Unscaled seconds of one forward pass over a layer's activations (one microbatch)."""
    tokens = c.microbatch_size * w.seq_len // c.cp
    moved = w.activations("none", c.precision).per_device(split, c.sequence_parallel) * tokens
    return moved / (cluster.node.gpu.hbm_bandwidth * HBM_EFFICIENCY)


def stash(w: Workload, c: Candidate, cluster: Cluster, split: int) -> float:
    """Seconds of copying what the remat policy keeps on the device into the layer loop's
    stacked buffers (one microbatch)."""
    tokens = c.microbatch_size * w.seq_len // c.cp
    kept = w.activations(c.remat, c.precision).per_device(split, c.sequence_parallel)
    return STASH_PASSES * kept * tokens / (cluster.node.gpu.hbm_bandwidth * HBM_EFFICIENCY)


def stash_seconds(w: Workload, c: Candidate, cluster: Cluster) -> float:
    """One step's residual copies on one device, pp = 1 (what calibrate leaves out)."""
    return c.microbatches * w.layers * stash(w, c, cluster, c.tp)


def weights(w: Workload, c: Candidate, cluster: Cluster, split: int) -> float:
    """Unscaled seconds of moving one layer's gathered weights once in float32 (the
    compiled step copies, transposes and converts them and their gradients per
    microbatch)."""
    gathered = w.shards(c.mesh_shape).layer_gathered * c.tp / split
    return 4 * gathered / (cluster.node.gpu.hbm_bandwidth * HBM_EFFICIENCY)


def head_memory(w: Workload, c: Candidate, cluster: Cluster) -> float:
    """Unscaled seconds of moving one microbatch's logits 4 times in the compute dtype
    (jaxsmp.losses: written, read for the normalizer and for the gradient, which is
    written)."""
    tokens = c.microbatch_size * w.seq_len // (c.cp if c.tp == 1 else 1)
    cbytes = c.compute_bytes
    return (4 * cbytes * tokens * w.vocab / c.tp
            / (cluster.node.gpu.hbm_bandwidth * HBM_EFFICIENCY))


def optimizer(w: Workload, c: Candidate, cluster: Cluster) -> float:
    """Unscaled seconds of AdamW and gradient accumulation over the local shards."""
    local = w.shards(c.mesh_shape).local
    return (local * (ADAMW_BYTES_PER_PARAM + ACCUMULATE_BYTES_PER_PARAM * (c.grad_accum - 1))
            / (cluster.node.gpu.hbm_bandwidth * HBM_EFFICIENCY))


def memory_bound(w: Workload, c: Candidate,
                 cluster: Cluster) -> tuple[float, float, float]:
    """Unscaled seconds of one step's memory-bound work on one device, pp = 1: (the
    layers' activation traffic, their weight traffic, the head's logits and the
    optimizer), the three parts :mod:`jaxsmp.plan.calibrate` scales to the compiled
    program."""
    per_layer = c.microbatches * w.layers
    return (per_layer * ELEMENTWISE_PASSES * elementwise(w, c, cluster, c.tp),
            per_layer * weights(w, c, cluster, c.tp),
            c.microbatches * head_memory(w, c, cluster) + optimizer(w, c, cluster))
