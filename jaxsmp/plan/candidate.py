"""One configuration of a training step on a cluster, and the step semantics it assumes."""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import numpy as np

from jaxsmp.checks import positive_int
from jaxsmp.nn.remat import POLICIES
from jaxsmp.pipeline.schedule import SCHEDULES, make_schedule
from jaxsmp.pipeline.simulator import Report, simulate
from jaxsmp.train.options import REDUCE_DTYPES, default_reduce_dtype
from jaxsmp.train.precision import precision_policy


@dataclass(frozen=True)
class Semantics:
    """How the step treats gathered layer weights.

    ``keep_gathered``: each layer's gathered weights stay alive from its forward to its
    backward (``None``: only with ``remat="none"``, a plain GSPMD step);
    otherwise they are freed after the forward use and gathered again in the backward.
    ``prefetch``: layer ``i + 1``'s shard is gathered while layer ``i`` computes (one
    more gathered layer alive, collectives hidden behind compute).
    ``megatron_tp``: tp splits each layer's matmuls, activations and gathered weights
    (Megatron); ``False`` is a plain GSPMD step:
    gathers whole layers over sdp x tp and every tp rank computes the whole layer.
    ``whole_forward``: ``remat="full"`` runs the layer's whole forward again (Megatron's
    checkpointing, PyTorch's before 2.1); ``False``: only what the backward pass reads,
    as JAX and XLA (and PyTorch's non-reentrant checkpointing since 2.1) do
    (:mod:`jaxsmp.plan.recompute`).
    """
    keep_gathered: bool | None = False
    prefetch: bool = True
    megatron_tp: bool = True
    whole_forward: bool = False

    def keeps_gathered(self, remat: str) -> bool:
        return remat == "none" if self.keep_gathered is None else self.keep_gathered

    def recomputed_share(self, w, remat: str) -> float:
        """The share of a layer's forward GEMM FLOPs (``w``: a ``Workload``) its backward
        pass runs again under ``remat``."""
        return 1.0 if self.whole_forward and remat == "full" else w.recomputed_share(remat)


TARGET = Semantics(keep_gathered=False, prefetch=True)   # jaxsmp's ZeRO-3
PLAIN_GSPMD = Semantics(keep_gathered=None, prefetch=False, megatron_tp=False)
# What jaxsmp.step compiles by default on CPU, where the pre-flight compiles (prefetch is
# on by default only on GPUs): the pre-flight compares against it.
COMPILED = Semantics(keep_gathered=False, prefetch=False, megatron_tp=True)


@dataclass(frozen=True)
class Candidate:
    """Mesh degrees, batch split and step options. ``microbatch_size``: sequences per
    data-parallel rank per microbatch; ``microbatches``: gradient-accumulation steps
    (pp = 1) or the pipeline's microbatches (pp > 1); ``cp``: devices each sequence is
    split over (context parallelism; the batch is not split over it); ``reduce_dtype``:
    the dtype of the gradient reduce-scatter over sdp and all-reduce over dp, ``fp32``
    or ``bf16``, ``None`` the step's default (:attr:`reduced`); ``ep``: expert
    parallelism, a mixture of experts' experts split over that many data devices (the
    batch is split over dp x ep x sdp; 1 for a dense model)."""
    dp: int
    sdp: int
    tp: int
    pp: int
    microbatch_size: int
    microbatches: int
    remat: str = "full"
    precision: str = "bf16"
    schedule: str = "simple"
    virtual_chunks: int = 1
    sequence_parallel: bool = False
    cp: int = 1
    reduce_dtype: str | None = None
    ep: int = 1

    def __post_init__(self) -> None:
        for name in ("dp", "sdp", "tp", "pp", "cp", "ep", "microbatch_size", "microbatches",
                     "virtual_chunks"):
            positive_int(name, getattr(self, name))
        if self.remat not in POLICIES:
            raise ValueError(f"unknown remat policy {self.remat!r}; valid: {POLICIES}")
        precision_policy(self.precision)  # raises, naming the valid precisions
        if self.reduce_dtype is not None and self.reduce_dtype not in REDUCE_DTYPES:
            raise ValueError(f"unknown reduce_dtype {self.reduce_dtype!r}; valid: "
                             f"{tuple(REDUCE_DTYPES)} or None (the step's default)")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown pipeline schedule {self.schedule!r}; valid: {SCHEDULES}")
        if self.virtual_chunks > 1 and self.schedule != "virtual":
            raise ValueError(f"virtual_chunks={self.virtual_chunks} needs schedule='virtual'")
        if self.cp > 1 and self.pp > 1:   # as jaxsmp.step refuses it
            raise ValueError(f"context parallelism (cp={self.cp}) with pipeline parallelism "
                             f"(pp={self.pp}) is not supported yet; use pp=1 or cp=1")
        if self.ep > 1 and (self.cp > 1 or self.sequence_parallel
                            or self.schedule == "interleaved"):   # as jaxsmp.step refuses
            raise ValueError(f"expert parallelism (ep={self.ep}) runs without cp, "
                             f"sequence_parallel and the interleaved (1F1B) schedule; got "
                             f"cp={self.cp}, sequence_parallel={self.sequence_parallel}, "
                             f"schedule={self.schedule!r}")

    @property
    def world(self) -> int:
        return self.dp * self.ep * self.sdp * self.cp * self.tp * self.pp

    @property
    def data(self) -> int:
        """Ways the global batch is split (dp x ep x sdp)."""
        return self.dp * self.ep * self.sdp

    @property
    def local_batch(self) -> int:
        """Sequences per data-parallel rank per step."""
        return self.microbatch_size * self.microbatches

    @property
    def global_batch(self) -> int:
        return self.local_batch * self.data

    @property
    def grad_accum(self) -> int:
        """Microbatches whose gradients one step sums outside a pipeline."""
        return self.microbatches if self.pp == 1 else 1

    @property
    def reduced(self) -> str:
        """The dtype gradients are reduced in: ``reduce_dtype``, or the step's default
        for the precision (``bf16`` with ``precision="bf16"``, else ``fp32``)."""
        return self.reduce_dtype or default_reduce_dtype(self.precision)

    @property
    def compute_bytes(self) -> int:
        """Bytes per element of the step's compute dtype (activations, gathered weights)."""
        return np.dtype(precision_policy(self.precision).compute_dtype).itemsize

    @property
    def reduce_bytes(self) -> int:
        """Bytes per gradient element in the reduce-scatter and the dp all-reduce."""
        return {"fp32": 4, "bf16": 2}[self.reduced]

    @property
    def offload(self) -> bool:
        return self.remat == "offload"

    @property
    def mesh_shape(self) -> dict[str, int]:
        return {"dp": self.dp, "pp": self.pp, "ep": self.ep, "sdp": self.sdp, "cp": self.cp,
                "tp": self.tp}

    def step_options(self) -> dict:
        """Keyword arguments of ``jaxsmp.step`` that run this candidate."""
        options = dict(microbatches=self.microbatches, precision=self.precision,
                       remat=self.remat, reduce_dtype=self.reduced)
        if self.pp > 1:
            options["pipeline"] = self.schedule
            if self.schedule == "virtual":
                options["virtual_chunks"] = self.virtual_chunks
        if self.sequence_parallel:
            options["sequence_parallel"] = True
        return options

    def label(self) -> str:
        parts = [f"dp={self.dp}", *([f"ep={self.ep}"] if self.ep > 1 else []),
                 f"sdp={self.sdp}", f"tp={self.tp}", f"pp={self.pp}",
                 *([f"cp={self.cp}"] if self.cp > 1 else []),
                 f"mbs={self.microbatch_size}x{self.microbatches}", f"remat={self.remat}"]
        if self.pp > 1:
            parts.append(self.schedule + (f"/{self.virtual_chunks}" if self.virtual_chunks > 1
                                          else ""))
        if self.sequence_parallel:
            parts.append("sp")
        if self.reduced != default_reduce_dtype(self.precision):
            parts.append(f"reduce={self.reduced}")
        return " ".join(parts)

    def as_dict(self) -> dict:
        return {**asdict(self), "reduce_dtype": self.reduced, "grad_accum": self.grad_accum,
                "offload": self.offload}


@functools.cache
def schedule_report(schedule: str, stages: int, microbatches: int, chunks: int = 1) -> Report:
    """The simulator's report (bubble, peak live activations) of a pipeline schedule."""
    return simulate(make_schedule(schedule, stages, microbatches, chunks))
