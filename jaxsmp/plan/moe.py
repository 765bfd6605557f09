"""What a mixture of experts costs the planner: its experts' GEMMs, the all-to-alls of
expert parallelism (``ep``) and the dispatch buffers, per device, one microbatch, one
MoE layer, as :mod:`jaxsmp.nn.moe` and :mod:`jaxsmp.nn.moe_dispatch` run them.

Rows: the grouped GEMMs run over every slot of the receive buffer. Without ``ep`` those
are the device's ``tokens x top_k`` assignments (a capacity factor drops assignments
but not rows); dropless under ``ep`` each of the ``ep`` destination rows of the buffer
holds ``tokens x top_k`` slots (a worst case: all of a device's assignments may go to
one device), so ``ep x tokens x top_k``; with a capacity factor ``experts x capacity``.

Kernel: on GPUs XLA (jax 0.10.2) compiles ``ragged_dot`` to one masked GEMM whose
contraction runs over every local expert's stacked weights (docs/moe.md), so each row
costs ``experts / ep`` experts' FLOPs (:data:`EXPERT_KERNEL` ``"masked"``, what runs);
``"grouped"`` prices a grouped GEMM (each row through its own expert only), which
jaxsmp does not have on GPUs yet. Under tp the compiled program splits the gate and up
projections over tp but runs the down projection whole on every tp rank
(``[rows, mlp] @ [mlp, embed]``, docs/moe.md's table), and its masked GEMMs read their
rows expanded to ``[rows, local experts x width]`` (:func:`working_bytes`).
"""
from __future__ import annotations

from jaxsmp.nn.moe import capacity
from jaxsmp.plan.calibration import COLLECTIVE_LAUNCH
from jaxsmp.plan.candidate import Candidate
from jaxsmp.plan.comm import axis_cost
from jaxsmp.plan.hardware import Cluster
from jaxsmp.plan.workload import Workload

EXPERT_KERNEL = "masked"     # what XLA:GPU compiles ragged_dot to (docs/moe.md)
KERNELS = ("masked", "grouped")
ID_BYTES = 4                 # the int32 local-expert ids sent beside the dispatched rows


def rows(w: Workload, c: Candidate, tokens: int) -> int:
    """Rows the receiving device's grouped GEMMs run over (see the module docstring);
    ``tokens``: one microbatch's tokens on one device."""
    assignments = tokens * w.top_k
    if c.ep == 1:
        return assignments
    factor = getattr(w.config, "capacity_factor", None)
    if factor is None:
        return c.ep * assignments
    return w.experts * capacity(factor, tokens, w.top_k, w.experts)


def per_expert(w: Workload) -> float:
    """Parameters of one expert of one layer (its SwiGLU's three matrices)."""
    return w.layer_expert_params / w.experts if w.experts else 0.0


def expert_flops(w: Workload, c: Candidate, tokens: int, split: int,
                 kernel: str = EXPERT_KERNEL) -> float:
    """Forward FLOPs of one layer's expert GEMMs on one device (``split``: how far tp
    splits each expert): every row through ``experts / ep`` experts (``masked``) or
    through its own (``grouped``)."""
    if not w.experts:
        return 0.0
    if kernel not in KERNELS:
        raise ValueError(f"unknown expert kernel {kernel!r}; valid: {KERNELS}")
    if kernel == "grouped":
        return 2 * rows(w, c, tokens) * per_expert(w) / split
    # gate and up split over tp, the down projection whole (as compiled)
    width = per_expert(w) * (2 / 3 / split + 1 / 3)
    return 2 * rows(w, c, tokens) * (w.experts // c.ep) * width


def layer_matmul_flops(w: Workload, c: Candidate, tokens: int, split: int,
                       kernel: str = EXPERT_KERNEL) -> float:
    """Forward FLOPs of one layer's matmuls on one device: 2 per token per dense weight
    (a mixture's router included), and the experts' GEMMs as they run."""
    dense = w.layer_matmul_params - w.layer_expert_params
    return 2 * dense / split * tokens + expert_flops(w, c, tokens, split, kernel)


def active_flops(w: Workload, tokens: int, split: int = 1) -> float:
    """Forward FLOPs of one layer's experts that the tokens use: ``top_k`` experts
    each (what model FLOPs and MFU count)."""
    return 2 * tokens * w.top_k * per_expert(w) / split


def dispatch_chunk(w: Workload, c: Candidate, tokens: int, cbytes: int) -> float:
    """Bytes one device sends each ``ep`` peer (itself included) in one all-to-all of
    the hidden rows: one destination row of the ``[ep, slots, embed]`` buffer."""
    return rows(w, c, tokens) / c.ep * w.hidden * cbytes


def all_to_all_seconds(cluster: Cluster, c: Candidate, chunk: float) -> float:
    """One all-to-all over ``ep`` of ``chunk`` bytes to each peer: every rank sends its
    chunks at once, the collectives cost model's ``a2a`` step (``ep`` groups are
    ``sdp x cp x tp`` devices apart, :data:`jaxsmp.AXES`)."""
    if c.ep == 1:
        return 0.0
    topo, model = axis_cost(cluster, c.ep, c.sdp * c.cp * c.tp)
    seconds = model.predict("a2a", int(chunk), topo)
    if seconds is None:   # calibrated for this topology without the a2a pattern
        seconds = model.model("a2a", int(chunk), topo)
    return COLLECTIVE_LAUNCH + seconds


def all_to_alls(c: Candidate) -> tuple[int, int]:
    """(hidden-row all-to-alls, id all-to-alls) of one MoE layer in one microbatch's
    forward and backward: dispatch and return forward, their transposes backward, and
    the forward's again where remat recomputes the layer (any policy but ``none``: an
    all-to-all is no matmul output, so no policy saves it)."""
    forwards = 1 if c.remat == "none" else 2
    return 2 * forwards + 2, forwards


def exchange_seconds(w: Workload, c: Candidate, cluster: Cluster, tokens: int,
                     cbytes: int) -> float:
    """Seconds of one MoE layer's all-to-alls in one microbatch, taken as exposed: the
    experts' GEMMs wait for the dispatch and the next layer for the return."""
    if c.ep == 1 or not w.experts:
        return 0.0
    hidden, ids = all_to_alls(c)
    row = all_to_all_seconds(cluster, c, dispatch_chunk(w, c, tokens, cbytes))
    id_chunk = rows(w, c, tokens) / c.ep * ID_BYTES
    return hidden * row + ids * all_to_all_seconds(cluster, c, id_chunk)


def working_bytes(w: Workload, c: Candidate, tokens: int, split: int, cbytes: int,
                  backend: str = "gpu") -> float:
    """Bytes of one MoE layer's experts beyond what its traced residuals hold (those
    cover ``tokens x top_k`` rows): under ``ep`` the send, receive, output and returned
    buffers ``[rows, embed]`` and the GEMMs' three ``[rows, mlp / tp]`` intermediates,
    less the ``tokens x top_k`` rows of each already counted; on GPUs, with more than
    one local expert, the masked GEMMs' expanded inputs ``[rows, local x embed]`` and
    ``[rows, local x mlp]`` (XLA:GPU's, docs/moe.md; XLA:CPU's ragged_dot is not modelled)."""
    if not w.experts:
        return 0.0
    n, base, local = rows(w, c, tokens), tokens * w.top_k, w.experts // c.ep
    ffn = per_expert(w) / (3 * w.hidden)
    masked = n * local * (w.hidden + ffn) if backend == "gpu" and local > 1 else 0.0
    if c.ep == 1:
        return cbytes * masked
    return cbytes * ((4 * n - 2 * base) * w.hidden + 3 * (n - base) * ffn / split + masked)


def saved_bytes(w: Workload, c: Candidate, tokens: int, split: int, cbytes: int) -> float:
    """Without remat, what one MoE layer saves beyond its traced residuals under ``ep``:
    the received rows and the two ``[rows, mlp / tp]`` GEMM outputs the SwiGLU's
    backward reads, for the rows beyond ``tokens x top_k``."""
    if c.ep == 1 or not w.experts or c.remat != "none":
        return 0.0
    extra = rows(w, c, tokens) - tokens * w.top_k
    ffn = per_expert(w) / (3 * w.hidden)
    return cbytes * extra * (w.hidden + 2 * ffn / split)

