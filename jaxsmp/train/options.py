"""The options of ``@jaxsmp.step``, checked when the step is declared."""
from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp

from jaxsmp import xla_flags
from jaxsmp.checks import positive_int
from jaxsmp.context import STRATEGIES
from jaxsmp.mesh import check_collectives
from jaxsmp.nn.fp8 import DEFAULT_HISTORY
from jaxsmp.nn.remat import POLICIES
from jaxsmp.pipeline.schedule import SCHEDULES
from jaxsmp.train.precision import precision_policy


def _check_partition(value) -> None:
    """``auto``, ``equal`` or a tuple of positive layer counts (checked against the
    model and mesh when the step sees them)."""
    if value in ("auto", "equal"):
        return
    if not (isinstance(value, tuple) and value and all(
            isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in value)):
        raise ValueError(f"pipeline_partition must be 'auto', 'equal' or a tuple of "
                         f"positive layer counts, one per pipeline stage; got {value!r}")


HEADS = ("auto", "last", "spread")
# the dtype of the gradient reduce-scatter over sdp and all-reduce over the data replicas
REDUCE_DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16}


@dataclass(frozen=True)
class StepOptions:
    """``microbatches``: gradient-accumulation steps per global batch. ``precision``:
    ``fp32``, ``bf16``, ``fp16`` (dynamic loss scaling) or ``fp8`` (float8 matmuls with
    ``fp8_history`` steps of amax history, :mod:`jaxsmp.nn.fp8`; the vocabulary
    projection too with ``fp8_vocab``). ``remat``: ``none``,
    ``full``, ``save_matmuls`` or ``offload``. ``clip_norm``: global-norm clipping
    (``None`` disables). ``collectives``: the sdp gather algorithm (default: the
    mesh's). ``bucket``: gather each layer's parameters with one collective over
    one flat buffer instead of one per parameter. ``prefetch``: gather the next layer
    while one computes, and reduce-scatter a layer's gradient while the next one's
    backward runs; ``None`` (default): on where collectives run beside compute (GPU)
    and XLA does not pipeline them itself (:meth:`prefetches`), off elsewhere (XLA:CPU
    runs them in line, so prefetch would only cost memory; docs/benchmarks.md).
    ``sequence_parallel`` (needs tp > 1): Megatron sequence parallelism, activations
    between the tensor-parallel matmuls split over tp on the sequence
    (:mod:`jaxsmp.train.sequence_parallel`). ``pipeline`` (when the mesh has
    pp > 1): ``simple`` (GPipe), ``virtual`` (``virtual_chunks`` chunks of layers per
    stage) or ``interleaved`` (1F1B, driven by hand); then ``microbatches`` is
    the pipeline's microbatch count (see :mod:`jaxsmp.pipeline`), and
    ``pipeline_partition`` how many layers each stage holds: ``auto`` (balanced on the
    model's compiled layer and head costs, :mod:`jaxsmp.train.stage_costs`), ``equal``
    or one count per stage (per virtual stage with ``virtual``); ``pipeline_head``
    (1F1B) where the vocabulary projection and loss run: ``last`` (the last stage's
    forward ticks), ``spread`` (every stage on ``1/pp`` of each microbatch's examples,
    which ``pp`` must divide) or ``auto`` (the faster on the same compiled costs;
    ``simple`` and ``virtual`` run the head on every stage). ``context_parallel``
    (needs cp > 1 when not ``auto``): how attention reaches the other ``cp`` devices'
    tokens, ``ulysses``, ``ring`` or ``auto`` (see :mod:`jaxsmp.context`).
    ``reduce_dtype``: the dtype gradients travel in through the reduce-scatter over
    ``sdp`` and the all-reduce over the data replicas, ``fp32`` or ``bf16`` (half the
    bytes; reduced as the bf16 GEMMs wrote them); ``None`` (default): ``bf16`` with
    ``precision="bf16"``, else ``fp32``. Accumulation across microbatches and the
    optimizer stay float32 (docs/zero3-memory.md)."""
    microbatches: int = 1
    precision: str = "fp32"
    fp8_history: int = DEFAULT_HISTORY
    fp8_vocab: bool = False
    remat: str = "none"
    clip_norm: float | None = 1.0
    collectives: str | None = None
    bucket: bool = True
    prefetch: bool | None = None
    sequence_parallel: bool = False
    pipeline: str = "simple"
    virtual_chunks: int = 2
    pipeline_partition: str | tuple[int, ...] = "auto"
    pipeline_head: str = "auto"
    context_parallel: str = "auto"
    reduce_dtype: str | None = None

    def __post_init__(self) -> None:
        if self.pipeline not in SCHEDULES:
            raise ValueError(f"unknown pipeline schedule {self.pipeline!r}; valid: {SCHEDULES}")
        positive_int("virtual_chunks", self.virtual_chunks)
        _check_partition(self.pipeline_partition)
        if self.pipeline_head not in HEADS:
            raise ValueError(f"unknown pipeline_head {self.pipeline_head!r}; valid: {HEADS}")
        if self.pipeline_head == "spread" and self.pipeline != "interleaved":
            raise ValueError(f"pipeline_head='spread' needs pipeline='interleaved' (1F1B); "
                             f"{self.pipeline!r} runs the head on every stage already")
        positive_int("microbatches", self.microbatches)
        precision_policy(self.precision)
        positive_int("fp8_history", self.fp8_history)
        if self.fp8_history != DEFAULT_HISTORY and not precision_policy(self.precision).fp8:
            raise ValueError(f"fp8_history={self.fp8_history} needs precision='fp8', "
                             f"got precision={self.precision!r}")
        if self.fp8_vocab is not False and (self.fp8_vocab is not True or
                                            not precision_policy(self.precision).fp8):
            raise ValueError(f"fp8_vocab={self.fp8_vocab!r} needs precision='fp8' and a "
                             f"bool, got precision={self.precision!r}")
        if self.remat not in POLICIES:
            raise ValueError(f"unknown remat policy {self.remat!r}; valid: {POLICIES}")
        if self.clip_norm is not None and (isinstance(self.clip_norm, bool) or not (
                isinstance(self.clip_norm, (int, float)) and self.clip_norm > 0)):
            raise ValueError(f"clip_norm must be a positive number or None (no clipping), "
                             f"got {self.clip_norm!r}")
        if self.collectives is not None:
            check_collectives(self.collectives)
        if self.prefetch not in (None, True, False):
            raise ValueError(f"prefetch must be True, False or None (on GPUs), "
                             f"got {self.prefetch!r}")
        if self.context_parallel not in STRATEGIES:
            raise ValueError(f"unknown context_parallel strategy {self.context_parallel!r}; "
                             f"valid: {STRATEGIES}")
        if self.sequence_parallel not in (True, False):
            raise ValueError(f"sequence_parallel must be True or False, "
                             f"got {self.sequence_parallel!r}")
        if self.reduce_dtype is not None and self.reduce_dtype not in REDUCE_DTYPES:
            raise ValueError(f"unknown reduce_dtype {self.reduce_dtype!r}; valid: "
                             f"{tuple(REDUCE_DTYPES)}")
        if self.bucket not in (True, False):
            raise ValueError(f"bucket must be True or False, got {self.bucket!r}")

    @property
    def reduce_jnp_dtype(self):
        """``reduce_dtype`` as a JAX dtype; ``None``: bfloat16 for bf16 compute (its loss
        curves match float32 reduction's, docs/zero3-memory.md), float32 otherwise."""
        default = "bf16" if self.precision == "bf16" else "fp32"
        return REDUCE_DTYPES[self.reduce_dtype or default]

    def prefetches(self, platform: str) -> bool:
        """Whether the step prefetches on devices of ``platform`` (``cpu``, ``gpu`` ...):
        ``None`` prefetches on GPUs unless XLA pipelines the layer loop's gathers and
        reduce-scatters itself (its flags, which jaxsmp sets on GPUs): both at once
        would hold a second prefetched layer (docs/zero3-memory.md)."""
        if self.prefetch is not None:
            return self.prefetch
        return platform in ("gpu", "cuda") and not xla_flags.pipelines_collectives()
