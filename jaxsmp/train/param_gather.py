"""ZeRO-3 gathering of parameter shards over ``sdp`` through the collectives seam.

Every parameter carries its resolved mesh axes in its ``mesh_axes`` metadata
(set by :func:`jaxsmp.init`). Inside the step's ``shard_map`` a parameter is a
local float32 ``sdp`` shard. :func:`gather_tree` casts it to the compute dtype and
all-gathers it along the dimension that names ``sdp``, under a custom VJP whose
backward is the matching reduce-scatter, done in float32: gradients are summed
at full precision whatever the compute dtype (XLA:CPU also miscompiles bf16
reduce-scatters inside loops, jax 0.10.2).
"""
from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

import collectives

# Bucketing merges small parameters' collectives into one; a parameter whose gathered
# size exceeds this already fills a collective on its own, and copying it into and
# out of the flat buffer only costs memory traffic (cf. PyTorch DDP's bucket_cap_mb).
BUCKET_MAX_BYTES = 4 << 20


def _is_var(x) -> bool:
    return isinstance(x, nnx.Variable)


def mesh_axes(variable: nnx.Variable) -> tuple:
    return variable.get_metadata()["mesh_axes"]


def is_stacked(variable: nnx.Variable) -> bool:
    return variable.get_metadata().get("out_sharding", (None,))[:1] == ("layers",)


def _sdp_dim(axes: tuple, ndim: int) -> int | None:
    offset = len(axes) - ndim  # 1 for a layer sliced out of a stack
    for i, dim in enumerate(axes[offset:]):
        if dim == "sdp" or (isinstance(dim, tuple) and "sdp" in dim):
            return i
    return None


def sdp_dim(variable: nnx.Variable) -> int | None:
    """The dimension of ``variable``'s value split over sdp (None: not split)."""
    return _sdp_dim(mesh_axes(variable), variable[...].ndim)


def manual_spec(axes: tuple, manual: tuple[str, ...]) -> P:
    """The ``shard_map`` spec of an array split over mesh ``axes``: only its ``manual`` axes."""
    def keep(dim):
        names = (dim,) if isinstance(dim, str) else (dim or ())
        kept = tuple(a for a in names if a in manual)
        return kept[0] if len(kept) == 1 else (kept or None)
    return P(*[keep(d) for d in axes])


def _major(x: jax.Array, dim: int) -> jax.Array:
    return jnp.moveaxis(x, dim, 0)


def _minor(x: jax.Array, dim: int) -> jax.Array:
    return jnp.moveaxis(x, 0, dim)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def cast_and_gather(shard: jax.Array, dim: int, dtype, algorithm: str) -> jax.Array:
    """``shard`` cast to ``dtype`` and all-gathered over sdp along ``dim``.

    The collective runs over the leading dimension, where each rank's block is
    contiguous; the full array comes back as a transposed view that XLA folds into
    its consumer (a matmul reads either layout), so only the 1/p shard is ever
    transposed, not the gathered array."""
    full = collectives.all_gather(_major(shard.astype(dtype), dim), "sdp", axis=0,
                                  algorithm=algorithm)
    return _minor(full, dim)


def _gather_fwd(shard, dim, dtype, algorithm):
    return cast_and_gather(shard, dim, dtype, algorithm), jnp.zeros((0,), shard.dtype)


def _gather_bwd(dim, dtype, algorithm, dtype_carrier, cotangent):
    # Reduce-scatter over the leading dimension, where each rank's block is
    # contiguous: the gradient matmul then writes the transposed layout directly
    # and only the 1/p shard is transposed back, instead of the full-size
    # gradient (e.g. an MLP-out kernel's [mlp, embed] sharded on embed).
    summed = collectives.reduce_scatter(_major(cotangent.astype(jnp.float32), dim), "sdp",
                                        axis=0, algorithm=algorithm)
    return (_minor(summed, dim).astype(dtype_carrier.dtype),)


cast_and_gather.defvjp(_gather_fwd, _gather_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def cast_and_gather_bucket(shards: list[jax.Array], dims: tuple[int, ...], dtype,
                           algorithm: str) -> list[jax.Array]:
    """Like :func:`cast_and_gather` for many shards at once: one collective over one
    flat buffer (``collectives.all_gather_tree``)."""
    cast = [_major(x.astype(dtype), d) for x, d in zip(shards, dims)]  # as cast_and_gather
    full = collectives.all_gather_tree(cast, "sdp", [0] * len(dims), algorithm)
    return [_minor(x, d) for x, d in zip(full, dims)]


def _bucket_fwd(shards, dims, dtype, algorithm):
    return (cast_and_gather_bucket(shards, dims, dtype, algorithm),
            [jnp.zeros((0,), x.dtype) for x in shards])


def _bucket_bwd(dims, dtype, algorithm, dtype_carriers, cotangents):
    # sdp dimension leading, as in _gather_bwd
    summed = collectives.reduce_scatter_tree(
        [_major(c.astype(jnp.float32), d) for c, d in zip(cotangents, dims)],
        "sdp", [0] * len(dims), algorithm)
    return ([_minor(s, d).astype(c.dtype) for s, d, c in zip(summed, dims, dtype_carriers)],)


cast_and_gather_bucket.defvjp(_bucket_fwd, _bucket_bwd)


def gather_variable(var: nnx.Variable, dtype, algorithm: str) -> nnx.Variable:
    value = var[...]
    if not jnp.issubdtype(value.dtype, jnp.floating):
        return var
    dim = _sdp_dim(mesh_axes(var), value.ndim)
    if dim is None:
        return var.replace(value.astype(dtype))
    return var.replace(cast_and_gather(value, dim, dtype, algorithm))


def _gather_bucketed(state: nnx.State, dtype, algorithm: str,
                     select: Callable[[nnx.Variable], bool]) -> nnx.State:
    variables, treedef = jax.tree.flatten(state, is_leaf=_is_var)
    def small(v):  # gathered size, only asked of parameters split over sdp
        return v[...].size * jax.lax.axis_size("sdp") * jnp.dtype(dtype).itemsize \
            <= BUCKET_MAX_BYTES
    picked = [i for i, v in enumerate(variables) if select(v)
              and jnp.issubdtype(v[...].dtype, jnp.floating)
              and _sdp_dim(mesh_axes(v), v[...].ndim) is not None and small(v)]
    out = [gather_variable(v, dtype, algorithm) if select(v) and i not in picked else v
           for i, v in enumerate(variables)]
    if picked:
        dims = tuple(_sdp_dim(mesh_axes(variables[i]), variables[i][...].ndim) for i in picked)
        full = cast_and_gather_bucket([variables[i][...] for i in picked], dims, dtype,
                                      algorithm)
        for i, value in zip(picked, full):
            out[i] = variables[i].replace(value)
    return jax.tree.unflatten(treedef, out)


def gather_tree(state: nnx.State, dtype, algorithm: str,
                select: Callable[[nnx.Variable], bool] = lambda v: True,
                bucket: bool = False) -> nnx.State:
    """The selected parameters of ``state`` in ``dtype``, gathered over sdp: one
    collective per parameter, or with ``bucket`` one for all of them but those larger
    than ``BUCKET_MAX_BYTES`` gathered, which get one each."""
    if bucket:
        return _gather_bucketed(state, dtype, algorithm, select)
    return jax.tree.map(lambda v: gather_variable(v, dtype, algorithm) if select(v) else v,
                        state, is_leaf=_is_var)
