"""Activation gathering: a GEMM whose weight outweighs its activations keeps the weight
split over ``sdp`` and gathers the batch instead, as GSPMD's partitioner chooses.

ZeRO-3 moves three weight-sized collectives per GEMM and step: the forward's gather,
the backward's re-gather and the gradient's reduce-scatter. Where a step has few
tokens (below about 4x the model width), the MLP's and the vocabulary projection's
activations are smaller than their weights. Then each device keeps its block of the
MLP's hidden units (or of the vocabulary) and runs those GEMMs on the whole ``sdp``
group's batch: Megatron's tensor parallelism over the ``sdp`` axis.

* A column Linear (output axis ``mlp`` or ``vocab``) all-gathers its input over the
  batch; a row Linear (input axis ``mlp``) reduce-scatters its partial sums back to the
  local batch before adding its bias; the vocabulary projection's logits go back to the
  local batch, whole over the vocabulary, by one all-to-all (:func:`split_linear`).
* The weight shard, stored split on ``embed``, moves to a split on ``mlp``/``vocab`` by
  one all-to-all (1/p of the weight), and its gradient, already summed over the group's
  tokens, goes back the same way: no reduce-scatter
  (:func:`jaxsmp.train.param_gather.to_split`, ``from_split``).

``activation_gather="auto"`` takes it per logical axis where it moves fewer bytes
(:func:`pick`); ``always`` and ``never`` force the choice. It needs ``sdp`` to be the
only split of the weights (``tp``, ``cp``, ``ep``, ``pp`` of 1) and no fp8.
"""
from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxsmp.nn.param import is_var, logical_axes
from jaxsmp.train.explain import note
from jaxsmp.train.param_gather import exchange, sdp_dim, summed_in

# logical axes whose Linears may run split over sdp: "mlp" between a column and a row
# Linear; "vocab" the output of the vocabulary projection
AXES = ("mlp", "vocab")
# a parameter's logical axes (without a stack's "layers") -> its dimension split over sdp
PATTERNS = {("embed", "mlp"): 1, ("mlp", "embed"): 0, ("mlp",): 0,
            ("embed", "vocab"): 1, ("vocab",): 0}


def unsupported(mesh_shape: dict, options: Any) -> str | None:
    """Why ``activation_gather`` cannot run on this mesh and options (None: it can)."""
    others = [f"{a}={mesh_shape.get(a, 1)}" for a in ("tp", "cp", "ep", "pp")
              if mesh_shape.get(a, 1) > 1]
    if mesh_shape.get("sdp", 1) == 1:
        return "the mesh has sdp=1 (nothing to gather over)"
    if others:
        return f"the mesh splits weights over {', '.join(others)} too"
    if options.precision == "fp8":
        return "precision='fp8' runs its Linears in float8"
    return None


def _axes(variable: nnx.Variable) -> tuple:
    axes = logical_axes(variable)
    return axes[len(axes) - variable[...].ndim:]  # a stack's layer slice drops "layers"


def target_dim(variable: nnx.Variable, split: frozenset) -> int | None:
    """The dimension of ``variable``'s value to split over sdp for the axes in ``split``
    (None: the parameter is gathered as usual)."""
    axes = _axes(variable)
    dim = PATTERNS.get(axes)
    return dim if dim is not None and axes[dim] in split else None


def split_linear(split: frozenset, in_axis: str, out_axis: str, x: jax.Array,
                 matmul, bias: jax.Array | None) -> jax.Array:
    """A Linear's ``matmul(x) + bias`` with its axes in ``split`` run over the sdp
    group's batch (the module docstring); the LayerContext's ``linear`` in a step."""
    column, row = out_axis in split, in_axis in split
    if column:
        x = jax.lax.all_gather(x, "sdp", axis=0, tiled=True)
    y = matmul(x)
    if row:
        y = summed_in(lambda t: jax.lax.psum_scatter(t, "sdp", scatter_dimension=0,
                                                     tiled=True), y)
    if bias is not None:
        y = y + bias
    if column and out_axis != "mlp":  # the logits: local batch, whole vocabulary
        y = exchange(y, 0, y.ndim - 1)
    return y


Kernel = tuple[tuple, tuple, bool]   # (logical axes of one layer, whole shape, stacked?)


def kernels_of(params: Any) -> list[Kernel]:
    """The 2-D kernels an axis of :data:`AXES` may split, from ``(logical axes, whole
    shape)`` pairs (a stack's leading ``layers`` axis dropped)."""
    out = []
    for axes, shape in params:
        stacked = int(tuple(axes[:1]) == ("layers",))
        axes, shape = tuple(axes[stacked:]), tuple(shape[stacked:])
        if len(axes) == 2 and axes in PATTERNS:
            out.append((axes, shape, bool(stacked)))
    return out


def _local_kernels(params: nnx.State, p: int) -> list[Kernel]:
    """:func:`kernels_of` the local shards ``params``, split over ``p`` devices of sdp."""
    pairs = []
    for v in jax.tree.leaves(params, is_leaf=is_var):
        shape = list(v.shape)
        if sdp_dim(v) is not None:
            shape[sdp_dim(v)] *= p
        pairs.append((logical_axes(v), shape))
    return kernels_of(pairs)


def pick(kernels: list[Kernel], mode: str, tokens: int, p: int,
         remat: str) -> tuple[frozenset, dict[str, tuple[float, float]]]:
    """The logical axes whose GEMMs gather activations, and per axis considered the
    elements each device moves per step (activation gathering, weight gathering):
    ``tokens`` per device (of the microbatch), ``p`` devices in ``sdp``. ZeRO-3: a weight
    gathered, gathered again for a stacked layer's backward, and reduce-scattered.
    Activation gathering: the shard moved there and back, and per Linear two
    activation-sized collectives (three when remat recomputes the layer's forward), plus
    the logits' two all-to-alls. ``auto`` takes the smaller; nothing that does not
    divide is split."""
    chosen, moved = [], {}
    for axis in AXES:
        mine = [k for k in kernels if axis in k[0]]
        if mode == "never" or not mine or any(s[PATTERNS[a]] % p for a, s, _ in mine):
            continue
        weights = sum((2 + stacked) * math.prod(s) for _, s, stacked in mine)
        acts = sum(n * elements for k in mine for n, elements in transfers(k, tokens, p, remat))
        moved[axis] = (acts, weights)
        if mode == "always" or acts < weights:
            chosen.append(axis)
    return frozenset(chosen), moved


def transfers(kernel: Kernel, tokens: int, p: int, remat: str) -> list[tuple[int, float]]:
    """(count, elements of each device's buffer) of the collectives one split kernel runs
    per microbatch: all-gathers of its input or reduce-scatters of its output over the
    group's batch (forward and backward, and the forward again where remat recomputes a
    stacked layer), its shard moved there and back, and for the vocabulary projection
    its logits' two all-to-alls."""
    axes, shape, stacked = kernel
    out = [(2 + (stacked and remat != "none"), tokens * p * shape[axes.index("embed")]),
           (2, math.prod(shape) / p)]
    if "vocab" in axes:
        out.append((2, tokens * shape[1]))
    return out


def for_step(options: Any, mesh_shape: dict, params: nnx.State, batch: Any) -> frozenset:
    """:func:`pick` for a step's options on its local ``params`` and microbatch, noted
    for ``step.explain`` (``always`` on a mesh it cannot serve was refused before
    tracing)."""
    mode, why = options.activation_gather, unsupported(mesh_shape, options)
    if mode == "never" or why:
        note("activation_gather", "none", None if mode == "never" else why)
        return frozenset()
    split, moved = pick(_local_kernels(params, mesh_shape["sdp"]), mode,
                        batch_tokens(batch), mesh_shape["sdp"], options.remat)
    value = ", ".join(a for a in AXES if a in split) or "none"
    reasons = "; ".join(f"{a}: {m[0] / 1e6:.0f}M elements moved per device against "
                        f"{m[1] / 1e6:.0f}M gathering weights" for a, m in moved.items())
    note("activation_gather", value, reasons if mode == "auto" else None)
    return split


def batch_tokens(batch: Any) -> int:
    """Tokens per device in ``batch`` (local): the largest ``batch x sequence`` of its
    arrays of two or more dimensions; 0 when it has none."""
    sizes = [x.shape[0] * x.shape[1] for x in jax.tree.leaves(batch) if jnp.ndim(x) >= 2]
    return max(sizes, default=0)
