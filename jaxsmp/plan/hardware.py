"""Accelerators and nodes from public data sheets; users register their own.

Every number here is a vendor data-sheet value (dense, no sparsity) or a public
measurement named beside it; nothing is fitted to the training results the planner is
checked against (see :mod:`jaxsmp.plan`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from collectives import CostModel
from jaxsmp.checks import positive_int

GiB = 1 << 30
GB = 1e9
# SMs a running collective holds: NCCL launches one thread block per channel, and its
# blocks never share an SM with compute kernels (NCCL's maintainer in
# https://github.com/NVIDIA/nccl/issues/689: 16 SMs on a DGX A100 with 8 NICs, of 108);
# on H100 an FSDP all-gather was measured launching 24 blocks of 132 SMs (NVIDIA
# developer forums, 2025: "Compute-Communication Overlap Causes Severe GEMM Performance
# Degradation because of Tail Effect").
A100_NCCL_SMS, H100_NCCL_SMS = 16 / 108, 24 / 132


@dataclass(frozen=True)
class GPU:
    """One accelerator. ``peak_flops``: dense bf16/fp16 tensor FLOP/s; ``fp8_flops``: dense
    float8 tensor FLOP/s (0: no FP8 tensor cores, which ``precision="fp8"`` needs);
    ``matmul_efficiency``:
    the largest measured fraction of it a matmul reaches; ``attention_efficiency``: the
    fraction FlashAttention-2's forward + backward reaches (pallas_kernels' FlashAttention
    is priced at it too); ``cudnn_attention_efficiency``: cuDNN's fused attention's;
    ``memory_bytes`` / ``hbm_bandwidth``
    (bytes/s); ``link_bandwidth``: its NVLink bytes/s per direction;
    ``collective_sm_share``: the fraction of its SMs NCCL's kernels hold while a collective
    runs (its thread blocks never share an SM with compute kernels), which the compute
    beside an overlapped collective loses; ``pcie_bandwidth``: bytes/s to pinned host
    memory and back when it has its PCIe link alone (:data:`PCIE_GEN4`, :data:`PCIE_GEN5`)."""
    name: str
    peak_flops: float
    memory_bytes: float
    hbm_bandwidth: float
    link_bandwidth: float
    matmul_efficiency: float
    attention_efficiency: float
    tf32_flops: float
    source: str = ""
    fp8_flops: float = 0.0
    collective_sm_share: float = A100_NCCL_SMS
    cudnn_attention_efficiency: float = 0.0
    pcie_bandwidth: float = 0.0

    def __post_init__(self) -> None:
        if not 0 < self.cudnn_attention_efficiency <= 1:
            raise ValueError(f"GPU {self.name!r}: cudnn_attention_efficiency must be in "
                             f"(0, 1], got {self.cudnn_attention_efficiency!r}")
        if self.pcie_bandwidth <= 0:
            raise ValueError(f"GPU {self.name!r}: pcie_bandwidth (bytes/s to host memory) "
                             f"must be > 0, got {self.pcie_bandwidth!r}")

    def attention_share(self, kernel: str) -> float:
        """The fraction of :meth:`flops` the attention ``kernel`` reaches, forward and
        backward: ``"cudnn"`` (cuDNN's fused attention), ``"pallas"`` (pallas_kernels')
        or ``"flash2"`` (FlashAttention-2, what published PyTorch runs use)."""
        if kernel == "cudnn":
            return self.cudnn_attention_efficiency
        if kernel in ("pallas", "flash2"):
            return self.attention_efficiency
        raise ValueError(f"unknown attention kernel {kernel!r}; known: {ATTENTION_KERNELS}")

    def flops(self, precision: str) -> float:
        """Peak matmul FLOP/s of the compute dtype of ``precision``: XLA:GPU runs float32
        matmuls at default precision on TF32 tensor cores; ``"fp8"`` computes in bf16
        outside the layers' Linears (attention, the vocabulary projection)."""
        return self.tf32_flops if precision == "fp32" else self.peak_flops

    def linear_flops(self, precision: str) -> float:
        """Peak FLOP/s of the layers' Linears (QKV, attention output, MLP in and out):
        their forward, input-gradient and kernel-gradient GEMMs run in float8 with
        ``"fp8"`` (:mod:`jaxsmp.nn.fp8`), else as :meth:`flops`."""
        if precision != "fp8":
            return self.flops(precision)
        self.check_precision(precision)
        return self.fp8_flops

    def check_precision(self, precision: str) -> None:
        """Refuses ``"fp8"`` on a GPU without FP8 tensor cores (as ``jaxsmp.step`` does
        below compute capability 8.9), naming the GPU and what to use."""
        if precision == "fp8" and not self.fp8_flops:
            raise ValueError(f"precision 'fp8' needs FP8 tensor cores (compute capability "
                             f">= 8.9: H100, H200); {self.name} has none; use 'bf16'")


@dataclass(frozen=True)
class Node:
    """A host: ``gpus`` x ``gpu``, ``network_gbps`` across hosts (all NICs together),
    ``pcie_bandwidth`` bytes/s per GPU to host memory (activation offload; default: the
    GPU's own rate shared by the :data:`SWITCH_GPUS` GPUs of a PCIe switch)."""
    name: str
    gpu: GPU
    gpus: int
    network_gbps: float
    pcie_bandwidth: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if self.pcie_bandwidth is None:
            object.__setattr__(self, "pcie_bandwidth", self.gpu.pcie_bandwidth / SWITCH_GPUS)

    def cost_model(self, link_efficiency: float = 0.8) -> CostModel:
        """The collectives cost model of this node type: NVLink per device inside the
        host, the host's network across hosts, each at ``link_efficiency`` of line rate
        (NCCL's bus bandwidth on NVLink and EFA is about 80% of it)."""
        return CostModel(alpha_intra=ALPHA_INTRA,
                         bw_intra=self.gpu.link_bandwidth * link_efficiency,
                         alpha_inter=ALPHA_INTER,
                         bw_inter=self.network_gbps * 1e9 / 8 * link_efficiency,
                         source=f"{self.name} data sheet x {link_efficiency:g}")


@dataclass(frozen=True)
class Cluster:
    """``nodes`` hosts of type ``node``."""
    node: Node
    nodes: int = 1

    def __post_init__(self) -> None:
        positive_int("nodes", self.nodes)

    @property
    def world(self) -> int:
        return self.node.gpus * self.nodes

    def __str__(self) -> str:
        return f"{self.nodes} x {self.node.name} ({self.world} x {self.node.gpu.name})"


# the attention kernels :meth:`GPU.attention_share` prices
ATTENTION_KERNELS = ("cudnn", "pallas", "flash2")
# Per-step latencies of the collectives cost model: NCCL's tuning constants for its Simple
# protocol (NVIDIA/nccl src/graph/tuning.cc, hwLatencies): an NVLink ring hop 3.4 us, a
# network hop 14 us.
ALPHA_INTRA, ALPHA_INTER = 3.4e-6, 14e-6
# Matmul efficiencies: the maximum achievable matmul FLOPS (MAMF) measured with BF16 inputs
# by S. Bekman, "ML Engineering", compute/accelerator: A100 SXM 267.9 of 312 TFLOPS (85.9%),
# H100 SXM 792.1 of 989 (80.1%); H200 is the same chip (GH200 measured 83.0%: 80% kept).
# FP8 dense peaks: 1979 TFLOPS on H100 SXM and H200 (data sheets: 3958 with sparsity),
# 2x bf16; the same fraction of it is assumed reachable (no FP8 MAMF measured here).
# Attention efficiencies: FlashAttention-2 forward + backward (Dao 2023, fig. 4-5: about
# 170 TFLOPS on A100 at head dim 128, causal) and on H100 (Shah et al. 2024,
# FlashAttention-3, fig. 7: FlashAttention-2 about 340 of 989 TFLOPS). cuDNN's on H100 from
# the same paper (figs. 5-6, head dim 128, 4k tokens): forward (causal) 518 and backward
# 499 TFLOPS, 504 in the backward's 2.5:1 FLOP ratio: 0.51 of 989, 1.6x FlashAttention-2
# there (319, 310). No published comparison on A100 was found: FlashAttention-2's rate.
# pallas_kernels' FlashAttention is priced at FlashAttention-2's rate in its own FLOPs (9
# score-sized matmuls): measured 0.29 to 0.41 of 989 TFLOP/s on one H200 at 2k and 8k
# tokens, head dim 64 and 128 (bench/results/2026-11-27-nvidia-h200-attention-tuned.md).
# Activation offload's rate to pinned host memory and back (remat="offload", overlapped
# with compute as the planner prices it) of a GPU alone on its PCIe x16 link: measured on
# one H200 (Gen5; GPT-NeoX 1.3b, seq 2048, bench/results/2026-11-27-nvidia-h200): 35.7
# GB/s, 0.71 of Gen5's 50 GB/s line rate; Gen4 (A100): half that line rate, the same 0.71.
PCIE_GEN5, PCIE_GEN4 = 35.7 * GB, 17.9 * GB
SWITCH_GPUS = 2   # GPUs of an 8-GPU HGX board behind one PCIe switch's host link
GPUS: dict[str, GPU] = {g.name: g for g in (
    GPU("A100-40GB", 312e12, 40 * GiB, 1555 * GB, 300 * GB, 0.859, 0.55, 156e12,
        "NVIDIA A100 data sheet (SXM4 40GB)", cudnn_attention_efficiency=0.55,
        pcie_bandwidth=PCIE_GEN4),
    GPU("A100-80GB", 312e12, 80 * GiB, 2039 * GB, 300 * GB, 0.859, 0.55, 156e12,
        "NVIDIA A100 data sheet (SXM4 80GB)", cudnn_attention_efficiency=0.55,
        pcie_bandwidth=PCIE_GEN4),
    GPU("H100-SXM", 989e12, 80 * GiB, 3350 * GB, 450 * GB, 0.801, 0.34, 494.7e12,
        "NVIDIA H100 data sheet (SXM5)", fp8_flops=1979e12,
        collective_sm_share=H100_NCCL_SMS, cudnn_attention_efficiency=0.51,
        pcie_bandwidth=PCIE_GEN5),
    GPU("H200", 989e12, 141 * GB, 4800 * GB, 450 * GB, 0.801, 0.34, 494.7e12,
        "NVIDIA H200 data sheet (SXM)", fp8_flops=1979e12,
        collective_sm_share=H100_NCCL_SMS, cudnn_attention_efficiency=0.51,
        pcie_bandwidth=PCIE_GEN5),
)}

NODES: dict[str, Node] = {n.name: n for n in (
    Node("p4d.24xlarge", GPUS["A100-40GB"], 8, 400,
         source="AWS: 8 x A100 40GB, NVSwitch 600 GB/s per GPU, 4 x 100 Gbps EFA"),
    Node("p4de.24xlarge", GPUS["A100-80GB"], 8, 400,
         source="AWS: 8 x A100 80GB, NVSwitch 600 GB/s per GPU, 4 x 100 Gbps EFA"),
    Node("p5.48xlarge", GPUS["H100-SXM"], 8, 3200,
         source="AWS: 8 x H100 80GB, NVSwitch 900 GB/s per GPU, 3200 Gbps EFA"),
    Node("p5e.48xlarge", GPUS["H200"], 8, 3200,
         source="AWS: 8 x H200 141GB, NVSwitch 900 GB/s per GPU, 3200 Gbps EFA"),
)}

_GENERIC = re.compile(r"^(\d+)x([A-Za-z0-9-]+)\+(\d+(?:\.\d+)?)Gbps$")


def register_gpu(gpu: GPU) -> GPU:
    """Adds (or replaces) an accelerator type, usable in generic node names."""
    GPUS[gpu.name] = gpu
    return gpu


def register_node(node: Node) -> Node:
    """Adds (or replaces) a node type, usable by name in :func:`node` and the CLI."""
    NODES[node.name] = node
    return node


def generic_node(gpu: str, gpus: int = 8, network_gbps: float = 400) -> Node:
    """``gpus`` x ``gpu`` with NVLink inside and ``network_gbps`` across hosts."""
    if gpu not in GPUS:
        raise ValueError(f"unknown GPU {gpu!r}; known: {sorted(GPUS)} (register_gpu adds one)")
    if gpus < 1 or network_gbps <= 0:
        raise ValueError(f"a node needs gpus >= 1 and network_gbps > 0; got {gpus}, "
                         f"{network_gbps}")
    return Node(f"{gpus}x{gpu}+{network_gbps:g}Gbps", GPUS[gpu], gpus, network_gbps,
                GPUS[gpu].pcie_bandwidth / min(gpus, SWITCH_GPUS), source="generic")


def node(name: str) -> Node:
    """A registered node type, or a generic one written ``8xA100-80GB+400Gbps``."""
    if name in NODES:
        return NODES[name]
    match = _GENERIC.match(name)
    if match:
        return generic_node(match.group(2), int(match.group(1)), float(match.group(3)))
    raise ValueError(f"unknown node type {name!r}; known: {sorted(NODES)}, or generic "
                     f"'<gpus>x<gpu>+<gbps>Gbps' with gpu in {sorted(GPUS)}")
