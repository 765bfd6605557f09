"""The one table that maps logical parameter axis names to mesh axes.

Tensor parallelism follows Megatron: the fused QKV and MLP-in projections are
column-parallel (their output axis, ``heads``/``mlp``, is split over ``tp``),
attention-out and MLP-out are row-parallel (their input axis is split), and the
embedding is vocabulary-parallel. ``embed`` goes to ``sdp``. A mixture of experts'
expert axis goes to ``ep`` (expert parallelism); its router is replicated. Any parameter that
the table leaves unsharded over ``sdp`` is then split over ``sdp`` on its first
dimension that divides (ZeRO-3 shards every parameter); a parameter with no such
dimension is an error, never silently replicated.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from jax.sharding import PartitionSpec as P

from collectives import axis_names

MeshAxes = str | tuple[str, ...] | None
Rules = Mapping[str, MeshAxes]

DEFAULT_RULES: dict[str, MeshAxes] = {
    # the stacked-layer axis: each pipeline stage a contiguous block; a layer count pp
    # does not divide (unequal stages) is kept whole on every stage
    "layers": "pp",
    "embed": "sdp",      # model width: ZeRO-3 shards it
    "heads": "tp",       # fused q/k/v heads x head_dim: column-parallel
    "kv_heads": "tp",    # grouped key/value heads
    "mlp": "tp",         # MLP hidden: column-parallel in, row-parallel out
    "vocab": "tp",       # vocabulary-parallel embedding and head
    "experts": "ep",     # mixture-of-experts experts: expert parallelism (ZeRO-3 over sdp inside)
    "router": None,      # the router's logits, one per expert: every device routes its tokens
    "head_dim": None,
    "norm": None,
}


def _check_divides(name: str, logical: str, size: int, axes: tuple[str, ...],
                   mesh_shape: Mapping[str, int]) -> None:
    degree = math.prod(mesh_shape[a] for a in axes)
    if size % degree:
        raise ValueError(
            f"parameter {name!r}: dimension {logical!r} of size {size} is not divisible "
            f"by mesh axes {axes} (degree {degree}); change the mesh or the rule for "
            f"{logical!r}")


def _add_sdp(name: str, dims: list[tuple[str, ...]], shape: Sequence[int],
             mesh_shape: Mapping[str, int], skip: int) -> None:
    """ZeRO-3 over ``sdp`` and ``cp`` together (context parallelism costs no parameter
    memory): both split the first dimension they divide, ``sdp`` major."""
    zero = tuple(a for a in ("sdp", "cp") if mesh_shape.get(a, 1) > 1
                 and not any(a in d for d in dims))
    if not zero:
        return
    degree = math.prod(mesh_shape[a] for a in zero)
    for i, d in enumerate(dims):  # cp right after an sdp the rules placed: one contiguous gather
        if zero == ("cp",) and "sdp" in d and shape[i] % (degree * math.prod(
                mesh_shape[a] for a in d)) == 0:
            k = d.index("sdp") + 1
            dims[i] = d[:k] + zero + d[k:]
            return
    for i in range(skip, len(shape)):
        if shape[i] % (degree * math.prod(mesh_shape[a] for a in dims[i])) == 0:
            dims[i] = zero + dims[i]  # sdp major: its gather is contiguous
            return
    raise ValueError(
        f"parameter {name!r} of shape {tuple(shape)} has no dimension divisible by "
        f"{' x '.join(f'{a}={mesh_shape[a]}' for a in zero)}, so ZeRO-3 cannot shard it; "
        f"choose degrees whose product divides one of its dimensions")


def resolve_spec(name: str, logical_axes: Sequence[str | None], shape: Sequence[int],
                 mesh_shape: Mapping[str, int], rules: Rules = DEFAULT_RULES) -> P:
    """The PartitionSpec of one parameter from its logical axis names."""
    if len(logical_axes) != len(shape):
        raise ValueError(f"parameter {name!r}: {len(logical_axes)} axis names "
                         f"{tuple(logical_axes)} for shape {tuple(shape)}")
    dims: list[tuple[str, ...]] = []
    used: set[str] = set()
    for logical, size in zip(logical_axes, shape):
        if logical is not None and logical not in rules:
            raise ValueError(f"parameter {name!r}: logical axis {logical!r} has no rule; "
                             f"known: {sorted(rules)}")
        axes = tuple(a for a in axis_names(rules.get(logical)) if a not in used
                     and mesh_shape.get(a, 1) > 1)
        if logical == "layers" and size % math.prod(mesh_shape[a] for a in axes):
            axes = ()  # unequal pipeline stages: every stage stores the whole stack
        _check_divides(name, logical, size, axes, mesh_shape)
        used.update(axes)
        dims.append(axes)
    skip = 1 if logical_axes and logical_axes[0] == "layers" else 0
    _add_sdp(name, dims, shape, mesh_shape, skip)
    return P(*[d if len(d) > 1 else (d[0] if d else None) for d in dims])


def batch_spec(ndim: int) -> P:
    """Batches are split over the data axes (dp, ep, sdp) on their leading dimension."""
    return P(("dp", "ep", "sdp"), *([None] * (ndim - 1)))
