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
ACTIVATION_GATHER = ("auto", "always", "never")
# the dtype of the gradient reduce-scatter over sdp and all-reduce over the data replicas
REDUCE_DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16}


def default_reduce_dtype(precision: str) -> str:
    """``reduce_dtype=None``'s choice: ``bf16`` for bf16 compute (its loss curves match
    float32 reduction's, docs/zero3-memory.md), ``fp32`` otherwise."""
    return "bf16" if precision == "bf16" else "fp32"


@dataclass(frozen=True)
class StepOptions:
    """How ``@jaxsmp.step`` runs a loss: each field is documented where it is declared.
    The trainer's flags come from ``STEP_HELP`` (:mod:`jaxsmp.cli.config`)."""
    microbatches: int = 1
    """Gradient-accumulation steps per global batch; with ``pp > 1`` the pipeline's
    microbatch count (:mod:`jaxsmp.pipeline`)."""
    precision: str = "fp32"
    """``fp32``, ``bf16``, ``fp16`` (dynamic loss scaling) or ``fp8`` (float8 layer
    matmuls with delayed scaling, :mod:`jaxsmp.nn.fp8`)."""
    fp8_history: int = DEFAULT_HISTORY
    """fp8: steps of amax history that scale each float8 matmul."""
    fp8_vocab: bool = False
    """fp8: the vocabulary projection in float8 too (untied heads only)."""
    remat: str = "none"
    """``none``, ``full``, ``save_qkv``, ``save_matmuls`` or ``offload``
    (:mod:`jaxsmp.nn.remat`)."""
    clip_norm: float | None = 1.0
    """Global-norm gradient clipping; ``None`` disables it."""
    collectives: str | None = None
    """The ``sdp`` gather algorithm; ``None``: the mesh's (:mod:`collectives`)."""
    bucket: bool = True
    """Gather each layer's parameters with one collective over one flat buffer, not one
    per parameter."""
    prefetch: bool | None = None
    """Gather the next layer while one computes, and reduce-scatter a layer's gradient
    while the next one's backward runs. ``None``: on where collectives run beside
    compute and XLA does not pipeline them itself (:meth:`prefetches`), off elsewhere
    (XLA:CPU runs them in line, so prefetch would only cost memory)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism (needs ``tp > 1``): activations between the
    tensor-parallel matmuls split over ``tp`` on the sequence
    (:mod:`jaxsmp.train.sequence_parallel`)."""
    pipeline: str = "simple"
    """With ``pp > 1``: ``simple`` (GPipe), ``virtual`` (``virtual_chunks`` chunks of
    layers per stage) or ``interleaved`` (1F1B, driven by hand)."""
    virtual_chunks: int = 2
    """Chunks of layers per stage of the ``virtual`` schedule."""
    pipeline_partition: str | tuple[int, ...] = "auto"
    """Layers per (virtual) stage: ``auto`` (balanced on the model's compiled layer and
    head costs, :mod:`jaxsmp.train.stage_costs`), ``equal`` or one count per stage."""
    pipeline_head: str = "auto"
    """1F1B: where the vocabulary projection and loss run: ``last`` (the last stage's
    forward ticks), ``spread`` (every stage on ``1/pp`` of each microbatch's examples,
    which ``pp`` must divide) or ``auto`` (the faster on the same compiled costs).
    ``simple`` and ``virtual`` run the head on every stage after the ticks."""
    context_parallel: str = "auto"
    """With ``cp > 1``: how attention reaches the other ``cp`` devices' tokens,
    ``ulysses``, ``ring`` or ``auto`` (:mod:`jaxsmp.context`)."""
    reduce_dtype: str | None = None
    """The dtype gradients travel in through the reduce-scatter over ``sdp`` and the
    all-reduce over the data replicas: ``fp32`` or ``bf16`` (half the bytes). ``None``:
    ``bf16`` with ``precision="bf16"``, else ``fp32``. Accumulation across microbatches
    and the optimizer stay float32 (docs/zero3-memory.md)."""
    activation_gather: str = "auto"
    """``auto``, ``always`` or ``never``: the MLP's and the vocabulary projection's GEMMs
    keep their weights split over ``sdp`` and gather the batch instead, where that moves
    fewer bytes than ZeRO-3's weight gathers (``auto``: a step of few tokens per width);
    needs ``sdp`` as the only weight split and no fp8
    (:mod:`jaxsmp.train.activation_gather`)."""

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
        if self.activation_gather not in ACTIVATION_GATHER:
            raise ValueError(f"unknown activation_gather {self.activation_gather!r}; valid: "
                             f"{ACTIVATION_GATHER}")
        if self.bucket not in (True, False):
            raise ValueError(f"bucket must be True or False, got {self.bucket!r}")

    @property
    def reduce_jnp_dtype(self):
        """``reduce_dtype`` as a JAX dtype; ``None``: :func:`default_reduce_dtype`."""
        return REDUCE_DTYPES[self.reduce_dtype or default_reduce_dtype(self.precision)]

    def prefetches(self, platform: str) -> bool:
        """Whether the step prefetches on devices of ``platform`` (``cpu``, ``gpu`` ...):
        ``None`` prefetches on GPUs unless XLA pipelines the layer loop's gathers and
        reduce-scatters itself (its flags, which jaxsmp sets on GPUs): both at once
        would hold a second prefetched layer (docs/zero3-memory.md)."""
        if self.prefetch is not None:
            return self.prefetch
        return platform in ("gpu", "cuda") and not xla_flags.pipelines_collectives()

    def compiler_options(self, devices: int) -> dict | None:
        """The XLA options the steps of these options compile with on a mesh of
        ``devices`` (``jax.jit``'s ``compiler_options``): the precision's and those
        jaxsmp's flags call for per step (:func:`jaxsmp.xla_flags.step_compiler_options`)."""
        options = {**precision_policy(self.precision).compiler_options,
                   **xla_flags.step_compiler_options(devices)}
        return options or None
