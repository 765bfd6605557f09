"""``jaxsmp.plan``: the best (dp, sdp, tp, pp, microbatch, remat, schedule) for a model
on a cluster, with predicted memory and TFLOP/s per GPU, and a pre-flight compile.

    plans = jaxsmp.plan("gpt_neox:13b", jaxsmp.plan.cluster("p4d.24xlarge", 16),
                        seq_len=2048, global_batch=1024)
    print(plans[0].candidate.step_options(), plans[0].throughput.model_tflops_per_gpu)
    jaxsmp.preflight("gpt_neox:13b", plans[0], seq_len=2048).summary()

    python -m jaxsmp.plan --model gpt_neox:13b --node p4d.24xlarge --nodes 16 \\
        --seq-len 2048 --global-batch 1024 [--top 10] [--json] [--preflight]

``jaxsmp.plan`` is this package and is callable (``jaxsmp.plan(...)`` is
:func:`~jaxsmp.plan.search.plan`), so one object serves ``jaxsmp.plan(...)``,
``jaxsmp.plan.cluster(...)`` and ``python -m jaxsmp.plan``.

Modules: ``hardware`` (GPUs, nodes), ``workload`` (shards, FLOPs, saved activations of a
model), ``candidate`` (one configuration, step semantics), ``memory``, ``throughput``
(step time) and ``traffic`` (the memory-bound work's bytes), ``moe`` (a mixture of
experts' GEMMs, all-to-alls and dispatch buffers),
``search``, ``report``, ``compiled`` (pre-flight on simulated CPU devices),
``gpu_target`` and ``gpu_preflight`` (pre-flight with XLA:GPU, deviceless), ``__main__`` (CLI).

Assumptions and sources
-----------------------
Hardware (``hardware.py``): dense bf16 peaks, HBM sizes and bandwidths from NVIDIA's A100,
H100 and H200 data sheets; NVLink 600 / 900 GB/s per GPU (300 / 450 each way); AWS's
p4d/p4de (4 x 100 Gbps EFA) and p5/p5e (3200 Gbps EFA) pages. Collectives reach 80% of
line rate (NCCL bus bandwidth), a host's network shared by its GPUs, and are priced per
algorithm step by step (``collectives.CostModel``: NCCL's ring pays ``p - h`` NVLink hops
and ``h - 1`` network hops of latency, its tree ``log2 h``) with NCCL's own per-step
latencies (its tuning model's Simple protocol: 3.4 us an NVLink hop, 14 us a network
hop).
Matmuls reach the "maximum achievable matmul FLOPS" measured by S. Bekman (ML
Engineering: A100 85.9%, H100 80.1%) or their bytes at HBM bandwidth, whichever is
slower; FlashAttention-2's forward + backward reaches 55% of peak on A100 (Dao 2023) and
34% on H100 (Shah et al. 2024, FlashAttention-3's FA2 baseline), cuDNN's fused attention,
which the step runs, 51% on H100 (the same paper) and FlashAttention-2's on A100 (no
comparison published); pallas_kernels' is priced at FlashAttention-2's; each executes
half the causal FLOPs, with a backward of 2.5 forwards (cuDNN's 5 matmuls) or,
where the step runs pallas_kernels' FlashAttention (ALiBi: Bloom), 3.5 (its 7).

Memory (``memory.py``): float32 master parameters (4 B), AdamW state (8 B) and float32
gradients per local parameter; a layer's saved activations are the residuals JAX's
autodiff keeps for it (``residuals.py``: the model's own layer under jaxsmp's remat
policy, traced abstractly, differentiated in its parameters and input only, residuals
that XLA's CSE merges counted once; ``full`` keeps the layer input; ``offload`` moves
what ``save_matmuls`` keeps to host memory), split over tp where they carry heads or the
MLP width (all of them with sequence parallelism); FlashAttention keeps no score matrix;
activation gathering without remat also keeps each layer's gathered MLP input.
The peak is the larger of two moments: the loss/head backward, and the first layer's
backward with every layer's activations saved, its gathered weights, its gradient
before the reduce-scatter (in ``reduce_dtype``) and its working set, in layers' worth of
what a layer saves without remat (``memory.RECOMPUTE_WORKING`` when recomputed: 1.3 on
XLA:GPU, 1.5 on XLA:CPU; ``memory.NONE_WORKING``, 0.85, without remat, for the
gradients). Pipelines hold ``m*v + p - 1`` microbatch-chunks (jaxsmp's SPMD GPipe runner saves every tick) or, for 1F1B, the
simulator's peak of stage inputs. A stated 1.5 GiB per GPU goes to the CUDA context,
library workspaces, NCCL buffers and fragmentation, and XLA may use 95% of HBM
(``XLA_PYTHON_CLIENT_MEM_FRACTION=0.95``, which jaxsmp sets on GPU hosts; JAX's default is
0.75: the planner follows the fraction set, ``jaxsmp.xla_flags.mem_fraction``), the
temporaries within 95% of what is left beside the arguments (XLA recomputes above it).

Mixture of experts (``moe.py``): the experts' GEMMs are priced as XLA:GPU compiles
``ragged_dot`` (jax 0.10.2, docs/moe.md): one masked GEMM per expert matrix over every
local expert's weights (its rows expanded to ``[rows, local experts x width]``, held in
the working set; under tp the down projection whole on every rank), so each routed row
costs ``experts / ep`` experts' FLOPs; model
FLOPs and MFU count the active experts only (``top_k`` per token). Under ``ep`` the
dispatch buffers hold the step's static worst case (dropless: ``ep x tokens x top_k``
rows; with a capacity factor ``experts x capacity``), the grouped GEMMs run over all of
them, and each all-to-all (dispatch and return forward, their transposes backward, the
forward's again under remat) is priced with ``collectives.CostModel``'s ``a2a`` step,
exposed. Expert state is split over ``ep x sdp``, dense state over ``sdp`` and reduced
over ``dp x ep``.

Step semantics (``candidate.Semantics``): the target is jaxsmp's ZeRO-3 (gathered
weights freed after the forward and gathered again in the backward, the next layer
prefetched, Megatron tensor parallelism), which is what the step compiles on a GPU;
``COMPILED`` is the same without prefetch, as the step compiles on CPU, where the
pre-flight compiles and compares. ``PLAIN_GSPMD`` is a plain GSPMD step
(with ``remat="none"`` every layer's gathered weights stay alive; no prefetch; tp ranks
gather and compute whole layers).

Time (``throughput.py``, ``traffic.py``): per microbatch and layer, forward = matmuls +
attention + memory-bound work, backward = 2 x matmuls + 2.5 (Pallas: 3.5) x attention +
3 x the forward's memory-bound work + the gathered weights' traffic; the residuals a
remat policy keeps are copied into the layer loop's stacked buffers (two passes over
them, ``STASH_PASSES``); recomputation adds the GEMMs the backward reads and attention
(XLA fuses recomputed elementwise work into the backward's kernels; an eager whole
forward, ``Semantics.whole_forward``, runs it again), and jaxsmp's 1F1B recomputes each
stage. Matmuls run at the achievable fraction above times ``matmul``, attention at its
kernel's rate times ``attention``, both measured on jaxsmp's own step traced on one H100
(the slowest of six rows); memory-bound work (activation traffic, weight traffic, the
head's logits and AdamW's 32 B per local parameter) moves at 85% of HBM bandwidth,
scaled per family to what the roofline over XLA:GPU's compiled program charges
(``calibration``, derived by ``python -m jaxsmp.plan.calibrate``; ``hlo_cost`` and
``compiled_time`` are that roofline, which the GPU pre-flight prints beside the analytic
model). With ``precision="fp8"`` the Linears' GEMMs run at the same fraction of the FP8
peak and each GEMM operand element moves ``FP8_QUANTISE_BYTES`` more per pass (casts to
float8, amax, transposes; ``calibrate --fp8``). sdp gathers (compute dtype) and reduce-
scatters (the candidate's ``reduce_dtype``: the step's default, bf16 with bf16 compute,
else float32) per layer and microbatch use the cost model's best algorithm on the sdp
group's topology (sharing the host's network with the other groups of the host), plus a
launch cost per collective call; with prefetch they hide behind a fitted share
(``overlap``) of the compute beside them, which meanwhile runs without the SMs NCCL's
kernels hold (``GPU.collective_sm_share``: 16 of 108 on A100, 24 of 132 on H100), and
the first gather and last reduce-scatter of each microbatch have nothing to hide behind;
else they add. A step on N GPUs waits for the slowest, ``1 + STRAGGLER_SPREAD sqrt(2 ln
N)`` times the rest (GPU speeds spread 1.5%: Sinha et al., SC22). Megatron TP adds two
all-reduces per layer pass; pipelines add one send per microbatch and chunk boundary and
the schedule simulator's bubble; dp adds one all-reduce of the gradient shards per step
(in ``reduce_dtype``). ``overlap`` is fitted by ``bench/plan_vs_published.py --fit`` on
the 8 runs it names (``FIT``: every third of its first list), with the one constant that
bench adds for the published eager stacks (their throughput against a compiled step's);
it reports the error on the 91 others, scaling series over node counts included
(docs/planner.md, "How accurate it is"). Model TFLOP/s use
:func:`jaxsmp.metrics.train_flops_per_token` (6N + attention, no recomputation); MFU
divides by the data-sheet peak.

What it leaves out: kernel launches in the analytic model (the compiled estimate has
them; small models are launch-bound), contention between overlapped collectives and
compute beyond the SMs NCCL holds (HBM bandwidth, a GEMM's last wave), data loading.
"""
from __future__ import annotations

import sys
import types

from jaxsmp.plan.candidate import (
    COMPILED,
    PLAIN_GSPMD,
    TARGET,
    Candidate,
    Semantics,
    schedule_report,
)
from jaxsmp.plan.compiled import Preflight, compile_memory, preflight
from jaxsmp.plan.gpu_preflight import GpuPreflight, gpu_preflight
from jaxsmp.plan.hardware import (
    GPU,
    GPUS,
    NODES,
    Cluster,
    Node,
    generic_node,
    node,
    register_gpu,
    register_node,
)
from jaxsmp.plan.memory import MemoryBreakdown, estimate_memory
from jaxsmp.plan.rates import Throughput
from jaxsmp.plan.search import Plan, candidates, evaluate, load_model, plan
from jaxsmp.plan.throughput import StepTime, estimate_time
from jaxsmp.plan.workload import Workload


def cluster(node_type: str, nodes: int = 1) -> Cluster:
    """``nodes`` hosts of ``node_type`` (a registered name or ``8xA100-80GB+400Gbps``)."""
    return Cluster(node(node_type), nodes)


class _CallablePackage(types.ModuleType):
    """Makes ``jaxsmp.plan(...)`` call :func:`plan` while staying this package."""

    def __call__(self, *args, **kwargs):
        return plan(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage

__all__ = ["COMPILED", "GPU", "GPUS", "NODES", "PLAIN_GSPMD", "TARGET", "Candidate",
           "Cluster", "GpuPreflight", "MemoryBreakdown", "Node", "Plan", "Preflight",
           "Semantics", "StepTime", "Throughput", "Workload", "candidates", "cluster",
           "compile_memory", "estimate_memory", "estimate_time", "evaluate", "generic_node",
           "gpu_preflight", "load_model", "node", "plan", "preflight", "register_gpu", "register_node",
           "schedule_report"]
