"""Per-device memory of one training step, component by component.

The components follow what ``jaxsmp.step`` keeps alive (see :mod:`jaxsmp.plan` for the
assumptions and sources). ``backend="cpu"`` predicts what XLA:CPU compiles (bfloat16
work is kept in float32, attention runs blockwise with its score tiles in memory), which
is what :mod:`jaxsmp.plan.compiled` measures; ``"gpu"`` is the target.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from jaxsmp import xla_flags
from jaxsmp.context.ring import tile_size as ring_tile
from jaxsmp.nn.fp8 import DEFAULT_HISTORY, ROWS
from jaxsmp.plan import moe
from jaxsmp.plan.activation_gather import planned
from jaxsmp.plan.candidate import TARGET, Candidate, Semantics, schedule_report
from jaxsmp.plan.workload import Workload
from jaxsmp.train.precision import precision_policy

GiB = 1 << 30
# Memory the step's buffers cannot use: CUDA context, cuBLAS/cuDNN workspaces, NCCL
# channel buffers and allocator fragmentation (an allowance, stated rather than measured).
FRAMEWORK_BYTES = 1.5 * GiB
# Blockwise attention's tile size on CPU (pallas_kernels.attention.DEFAULT_BLOCKS).
_CPU_BLOCK = 512
OPTIMIZER_BYTES_PER_PARAM = 8   # AdamW: float32 mu and nu
# What the compiled step holds at the loss per logit, in copies of the compute dtype:
# the loss keeps the logits (float32 only inside its fusions, jaxsmp.losses) and writes
# their gradient; measured on XLA:GPU (GPT-NeoX 1.3b, 8 x H100, sdp=8: 4 x 2048 tokens per
# GPU, remat full 3,368 MiB compiled / none 14,885; 10 x 2048, none 35,258): 2 copies
# model them at -13.0% / -2.8% / +0.0%, 2.5 at -1.3% / -0.2% / +2.8%. XLA:CPU (which
# keeps bf16 work in float32): 2, as before the loss changed.
LOGIT_COPIES = {"gpu": 2.5, "cpu": 2.0}
# What the backward pass of one layer holds beyond the saved activations, in layers'
# worth of what a layer saves without remat (measured on compiled steps: XLA:GPU's in
# bench/plan_memory_gpu.py, XLA:CPU's in tests/jaxsmp/test_plan_memory.py). Without
# remat, its activations' gradients: 0.75 to 0.95 of a layer on XLA:GPU. With remat,
# the recomputed activations and the float32 temporaries of the norms' gradients (which
# a layer without remat no longer saves, jaxsmp.nn.norm): 1.3 on XLA:GPU (Llama 7b
# 1.5, GPT-NeoX-20B width with activation gathering 1.0), 1.15 to 2.3 on XLA:CPU, which
# fuses less of the gradients.
NONE_WORKING = 0.85
RECOMPUTE_WORKING = {"gpu": 1.3, "cpu": 1.5}
# precision="fp8": each Linear's float32 amax histories, one row per quantized tensor
# (input, kernel, output gradient) of DEFAULT_HISTORY steps (jaxsmp.nn.fp8).
AMAX_BYTES_PER_LINEAR = len(ROWS) * DEFAULT_HISTORY * 4


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per device. ``state``: float32 master parameters + optimizer state + fp8
    amax histories (the step's arguments and, donated, its outputs); ``batch``: the
    token shard; the rest are the compiled step's temporaries."""
    params: float
    optimizer: float
    batch: float
    grads: float
    gathered: float
    activations: float
    working: float
    logits: float
    framework: float
    amax: float = 0.0
    phase: str = "backward"

    @property
    def state(self) -> float:
        return self.params + self.optimizer + self.amax

    @property
    def arguments(self) -> float:
        return self.state + self.batch

    @property
    def temporaries(self) -> float:
        return self.grads + self.gathered + self.activations + self.working + self.logits

    @property
    def peak(self) -> float:
        """Arguments + temporaries (outputs alias the donated state)."""
        return self.arguments + self.temporaries

    @property
    def total(self) -> float:
        return self.peak + self.framework

    def as_gib(self) -> dict:
        numbers = {k: v for k, v in asdict(self).items() if k != "phase"}
        return {k: v / GiB for k, v in {**numbers, "total": self.total}.items()}


def pipeline_inflight(c: Candidate) -> int:
    """Microbatch-chunks whose activations one stage holds at once: the SPMD runner of
    ``simple``/``virtual`` keeps every tick's (``m*v + p - 1``); 1F1B keeps the simulated
    peak of stage inputs (``p``), with ``tp``'s fused ticks ``2p - 1``
    (:mod:`jaxsmp.pipeline.fused_ticks`). 1 without a pipeline."""
    if c.pp == 1:
        return 1
    if c.schedule == "interleaved" and c.tp > 1:
        return 2 * c.pp - 1
    if c.schedule == "interleaved":
        # the arguments as throughput's bubble passes them: one lru_cache entry, one simulation
        return max(schedule_report("interleaved", c.pp, c.microbatches,
                                   c.virtual_chunks).peak_activations)
    return c.microbatches * c.virtual_chunks + c.pp - 1


def estimate_memory(w: Workload, c: Candidate, semantics: Semantics = TARGET,
                    backend: str = "gpu", rules=None) -> MemoryBreakdown:
    """Per-device memory of candidate ``c`` at the step's peak: the larger of two
    moments, the loss and head backward, and the backward of the first layer (every
    layer's activations still saved). ``ValueError`` if the model does not divide."""
    shards = w.shards(c.mesh_shape, rules)
    cbytes = _compute_bytes(c, backend)   # XLA:CPU keeps bfloat16 work in float32
    # the dtype of the gradient reduce-scatter (XLA:CPU keeps bfloat16 work in float32)
    rbytes = 4 if backend == "cpu" else c.reduce_bytes
    tp = c.tp if semantics.megatron_tp else 1     # how far tp splits a layer's work
    tokens = c.microbatch_size * w.seq_len // c.cp       # one microbatch, one device
    layers = math.ceil(w.layers / c.pp)
    gathers = c.sdp * c.cp > 1 or cbytes < 4             # else the shards are used as they are
    # activation gathering: its kernels stay 1/sdp, kept for the backward pass
    split = planned(w, c, tokens, cbytes)
    unsplit = (1 - 1 / c.sdp)
    layer = (shards.layer_gathered - unsplit * split.layer_weights) * c.tp // tp if gathers else 0
    top = (shards.top_gathered - unsplit * split.top_weights) * c.tp // tp if gathers else 0
    saved_split = cbytes * layers * split.layer_weights / c.sdp
    # without remat the backward keeps each layer's gathered MLP input beyond its own rows
    gathered_inputs = (cbytes * layers * split.layer_input * (1 - 1 / c.sdp)
                       if c.remat == "none" else 0.0)
    kept = _kept_layers(c, semantics, layers)
    accumulator = 4 * shards.local if c.grad_accum > 1 else 0
    saved = (_saved_activations(w, c, tokens, layers, tp, backend) + saved_split
             + gathered_inputs)
    state = dict(params=4 * shards.local, optimizer=OPTIMIZER_BYTES_PER_PARAM * shards.local,
                 batch=4 * c.local_batch * w.seq_len, amax=amax_bytes(w, c),
                 framework=FRAMEWORK_BYTES if backend == "gpu" else 0.0)
    embedding = _whole_sequence_embedding(w, c, cbytes)
    # with tp > 1 the head and loss run on the whole sequence (jaxsmp.context.sequence)
    head_tokens = (tokens * (c.cp if c.tp > 1 else 1)
                   * (c.microbatches if c.pp > 1 and c.schedule != "interleaved" else 1))
    head = MemoryBreakdown(
        **state, grads=accumulator + 4 * top,
        gathered=cbytes * top + (cbytes * kept * layer if kept > 2 else 0),
        activations=saved, working=embedding,
        logits=head_tokens * w.vocab / tp * LOGIT_COPIES[backend] * cbytes,
        phase="head")
    full = w.activations("none", c.precision, backend).per_device(tp, c.sequence_parallel)
    layers_held = NONE_WORKING if c.remat == "none" else RECOMPUTE_WORKING[backend]
    working = (tokens * layers_held * full
               + moe.working_bytes(w, c, tokens, tp, cbytes, backend))   # the experts' buffers
    backward = MemoryBreakdown(
        **state,
        grads=(accumulator + 4 * shards.stacked_local + _pipeline_grads(c, shards, layer, layers)
               + (rbytes * layer if semantics.prefetch else 0)),  # a layer's delayed scatter
        gathered=cbytes * kept * layer + max(0, 4 - cbytes) * layer,
        activations=saved, working=(working + embedding + _attention_tiles(w, c, tp, backend)
                                    + _ring_buffers(w, c, tokens, tp, cbytes, backend)),
        logits=0.0, phase="backward")
    return max(head, backward, key=lambda m: m.peak)


def amax_bytes(w: Workload, c: Candidate) -> float:
    """The fp8 amax histories on one device: replicated over dp, sdp, cp and tp, split
    over pp with the layer stack when pp divides it (:mod:`jaxsmp.train.fp8_state`);
    0 for other precisions. Weights are gathered and temporaries kept in bf16, as the
    compute dtype of ``"fp8"`` already states."""
    if not precision_policy(c.precision).fp8:
        return 0.0
    stacked, top = w.fp8_linears
    stored = w.layers // c.pp if w.layers % c.pp == 0 else w.layers
    return AMAX_BYTES_PER_LINEAR * (stacked * stored + top)


def _pipeline_grads(c: Candidate, shards, layer: float, layers: int) -> float:
    """Gradients a pipeline holds across its ticks: the stage's layer gradients at
    gathered size (stacked, before their reduce-scatter), and for 1F1B float32
    accumulators of the stage's parameter shards (stacked and top-level)."""
    if c.pp == 1:
        return 0.0
    return 4 * layers * layer + (4 * shards.local if c.schedule == "interleaved" else 0)


def _kept_layers(c: Candidate, semantics: Semantics, layers: int) -> int:
    """Gathered layers alive at once: one (two with prefetch), or when kept for the
    backward pass every layer of every microbatch-chunk whose backward is pending."""
    if not semantics.keeps_gathered(c.remat):
        return 1 + int(semantics.prefetch)
    if c.pp > 1 and c.schedule != "interleaved":
        return layers // c.virtual_chunks * pipeline_inflight(c)
    return layers


def _saved_activations(w: Workload, c: Candidate, tokens: int, layers: int, tp: int,
                       backend: str) -> float:
    """Every activation the backward pass will read, on one device."""
    saved = w.activations(c.remat, c.precision, backend).per_device(tp, c.sequence_parallel)
    inflight = pipeline_inflight(c)
    if c.pp > 1 and c.schedule == "interleaved":
        # stage inputs of p microbatches in 3 buffers, every microbatch's input cotangent,
        # and one microbatch's stage activations while its backward recomputes them
        carry = w.activations("full", c.precision, backend).replicated
        return tokens * carry * (3 * inflight + c.microbatches) + tokens * saved * layers
    per_layer = tokens * saved + moe.saved_bytes(w, c, tokens, tp, _compute_bytes(c, backend))
    return per_layer * layers / c.virtual_chunks * inflight


def _compute_bytes(c: Candidate, backend: str) -> int:
    """Bytes of the compute dtype (float32 on XLA:CPU, which computes bfloat16 so)."""
    if backend == "cpu":
        return 4
    return c.compute_bytes


def _whole_sequence_embedding(w: Workload, c: Candidate, cbytes: int) -> float:
    """With cp the embedding runs before the sequence split: its rows and their
    cotangent cover whole sequences, and a looked-up table's sdp shard is gathered over
    cp (sizes of the compiled step on XLA:CPU, test_plan_context_parallel.py)."""
    if c.cp == 1:
        return 0.0
    table = 0 if w.tied else cbytes * w.vocab * w.hidden / (c.sdp * c.tp)
    return table + 2 * cbytes * c.microbatch_size * w.seq_len * w.hidden


def _ring_buffers(w: Workload, c: Candidate, tokens: int, tp: int, cbytes: int,
                  backend: str) -> float:
    """Ring attention's backward: the visiting k, v and their float32 dk, dv accumulators,
    each twice (sent and received)."""
    if c.cp == 1 or w.context_strategy(c.cp, tp, backend) != "ring":
        return 0.0
    kv = tokens * w.kv_heads / tp * (w.hidden // w.heads)
    return 2 * kv * (2 * cbytes + 2 * 4)


def _attention_tiles(w: Workload, c: Candidate, tp: int, backend: str) -> float:
    """Blockwise attention's float32 score tiles of one query block (two alive: scores
    and probabilities, or their gradients); FlashAttention keeps them on chip (GPU).
    Under cp, ulysses runs whole sequences of ``heads/cp`` heads; ring runs tiles of at
    most ``ring.TILE`` dividing its chunks of ``seq/(2 cp)`` tokens, on every head."""
    if backend != "cpu":
        return 0.0
    heads, block = w.heads / tp, min(_CPU_BLOCK, w.seq_len)
    if c.cp > 1 and w.context_strategy(c.cp, tp, backend) == "ulysses":
        heads /= c.cp
    elif c.cp > 1:
        block = ring_tile(w.seq_len // (2 * c.cp))
    return 2 * 4 * c.microbatch_size * heads * block * block


def capacity(memory_bytes: float) -> float:
    """What XLA may allocate on a device of ``memory_bytes``: the fraction a run started
    here gets (``jaxsmp.xla_flags.mem_fraction``: 0.95, or the user's
    ``XLA_PYTHON_CLIENT_MEM_FRACTION``)."""
    return xla_flags.mem_fraction() * memory_bytes


def temporaries_limit(capacity_bytes: float, arguments: float) -> float:
    """The temporaries XLA:GPU plans a step within, on a device whose allocator holds
    ``capacity_bytes``, beside ``arguments`` (the donated state and batch): above it XLA
    recomputes to stay within it, and the step runs slower than planned."""
    return xla_flags.XLA_SLOP * max(capacity_bytes - arguments, 0.0)


def fits(m: MemoryBreakdown, capacity_bytes: float) -> bool:
    """Whether a step of breakdown ``m`` runs as planned on a device whose allocator
    holds ``capacity_bytes``: its total within it, its temporaries within XLA's limit."""
    return bool(m.total <= capacity_bytes
                and m.temporaries <= temporaries_limit(capacity_bytes, m.arguments))
