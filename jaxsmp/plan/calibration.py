"""The time model's constants, cached here so the search never compiles.

Three kinds, from three scripts:

- **Derived from compiled programs** (``python -m jaxsmp.plan.calibrate``): per model
  family, what the roofline over XLA:GPU's optimized HLO (:mod:`jaxsmp.plan.hlo_cost`)
  charges for memory-bound work (everything not a GEMM or fused attention: norms,
  rotary, activations, residuals, casts, the loss, the optimizer), over what the
  analytic model charges for it. ``layer`` scales a layer's activation traffic,
  ``weights`` its gathered weights' traffic per microbatch (copies, transposes, float32
  gradient conversions), ``outside`` the head, loss and optimizer. Nothing published
  enters these.
- **Measured on jaxsmp's own step** (``gpu_check``'s kernels section, a ``jax.profiler``
  trace of the step on one H100; ``python bench/plan_vs_measured.py --rates``):
  ``matmul`` and ``attention`` multiply each GPU's published achievable rates (Bekman's
  MAMF, the attention kernel's: cuDNN's, FlashAttention-2's or the Pallas kernel's) so
  that the planner's GEMM and attention seconds are what the traced step's kernels
  took, at the slowest traced row's rate.
- **Fitted to published runs** (``python bench/plan_vs_published.py --fit``, on the
  runs that script marks ``fit``; the others are held out): ``overlap``, the share of
  the concurrent compute a prefetched ZeRO-3 collective can hide behind. (That script
  also fits how much of a compiled step's throughput the published eager stacks reach;
  the planner plans jaxsmp's compiled step and never uses it.)

Fixed: HBM traffic reaches :data:`HBM_EFFICIENCY` of the data sheet (device-to-device
copy benchmarks reach 85-90% on A100 and H100), a step waits for the slowest of its GPUs
(:data:`STRAGGLER_SPREAD`), every collective call pays
:data:`COLLECTIVE_LAUNCH` beyond the cost model's per-message alpha terms, and a hidden
collective holds the share of the SMs NCCL's kernels take (``GPU.collective_sm_share``,
sourced in :mod:`jaxsmp.plan.hardware`) from the compute beside it.
"""
from __future__ import annotations

from dataclasses import dataclass

HBM_EFFICIENCY = 0.85
# GPUs of one SKU run at speeds spread normally with this coefficient of variation, and a
# synchronous step waits for the slowest of its N, about sqrt(2 ln N) sigma above the
# mean: Sinha et al., "Not All GPUs Are Created Equal" (SC22) measured 8% between the
# fastest and the slowest GPU of a cluster (outliers excluded) over five clusters, read
# as a normal distribution's box-plot whiskers (5.4 sigma)
STRAGGLER_SPREAD = 0.015
# FlashAttention's backward runs 5 matmuls of the forward's 2 (Dao 2023).
ATTENTION_BACKWARD = 2.5
COLLECTIVE_LAUNCH = 10e-6   # NCCL kernel launch and group synchronisation per call


@dataclass(frozen=True)
class Fitted:
    """Kernel rates measured on jaxsmp's traced step and the overlap fitted to published
    runs (see the module docstring)."""
    matmul: float = 1.0
    attention: float = 1.0
    overlap: float = 1.0

    def __post_init__(self) -> None:
        for name in ("matmul", "attention", "overlap"):
            value = getattr(self, name)
            if not 0 < value <= 1.5:
                raise ValueError(f"fitted constant {name} must be in (0, 1.5], got {value!r}")


@dataclass(frozen=True)
class MemoryScale:
    """Compiled over analytic memory-bound seconds: a layer's activation traffic, its
    weight traffic (per microbatch), and the head, loss and optimizer outside the layers."""
    layer: float
    weights: float
    outside: float


# matmul, attention: the slowest of the six steps traced on one H100 (2026-11-28:
# GPT-NeoX 1.3b none, full, save_matmuls and fp8, Llama 7b width, BLOOM 1b7's Pallas
# attention), the planner's seconds at 1 over the traced ones: GEMMs 0.905 to 0.955,
# attention 0.710 to 0.902. overlap: python bench/plan_vs_published.py --fit.
FITTED = Fitted(matmul=0.9, attention=0.71, overlap=1.0)
# python -m jaxsmp.plan.calibrate (XLA:GPU deviceless, jax 0.10.2, A100-80GB target;
# rerun 2026-11-26 after hlo_cost prices reduce-scatter-done as free and Bloom's Pallas
# attention by its FLOPs, both of which it had counted as memory-bound work; gpt_neox and
# llama again 2026-11-27 after a layer's residuals stopped counting float32 copies of q
# and k and what XLA's CSE merges, which moved their analytic activation traffic; all
# three again 2026-11-27 after the norms stopped keeping their float32 intermediates,
# jaxsmp.nn.norm, which cut both the compiled and the analytic activation traffic; all
# three again 2026-11-27 after the loss stopped keeping float32 logits, jaxsmp.losses;
# all three 2026-11-28 with the residual copies priced apart and a fourth shape per
# family, remat none, reproduced by a rerun the same day; compiled with jaxsmp's GPU
# overlap flags, which calibrate sets itself since, tests/jaxsmp/test_plan_calibrate.py;
# all three again 2026-11-28 after the step ran accumulated microbatches one at a time,
# pipeline.microbatch.one_at_a_time: were 1.804 1.966 1.032, 1.082 0.648 1.655, 1.165
# 1.434 1.000)
MEMORY_SCALE: dict[str, MemoryScale] = {
    "gpt_neox": MemoryScale(1.817, 1.904, 1.026),
    "bloom": MemoryScale(1.096, 0.580, 1.644),
    "llama": MemoryScale(1.170, 1.404, 1.000),
}


# HBM bytes per GEMM operand element and pass that precision="fp8" adds around its float8
# GEMMs (casts to float8, amax reductions, transposed copies; XLA's fp8 rewrite), over
# the compiled bf16 step reducing in float32 as fp8 does: python -m jaxsmp.plan.calibrate
# --fp8 (XLA:GPU deviceless, H100-SXM, 2026-11-28)
FP8_QUANTISE_BYTES = 4.41  # per shape (FP8_SHAPES): 4.23, 4.12, 4.87


def memory_scale(family: str | None) -> MemoryScale:
    """The family's derived scales; a family never compiled gets their mean."""
    if family in MEMORY_SCALE:
        return MEMORY_SCALE[family]
    n = len(MEMORY_SCALE)
    return MemoryScale(*(sum(getattr(s, f) for s in MEMORY_SCALE.values()) / n
                         for f in ("layer", "weights", "outside")))
