"""ZeRO-3 gathering of parameter shards over ``sdp`` through the collectives seam.

Every parameter carries its resolved mesh axes in its ``mesh_axes`` metadata (set by
:func:`jaxsmp.init`). Inside the step's ``shard_map`` a parameter is a local float32
``sdp`` shard. :func:`gather_shards` casts shards to the compute dtype and all-gathers
them along the dimension that names ``sdp``, under one custom VJP whose backward is the
matching reduce-scatter in the step's ``reduce_dtype``: float32 (gradients summed at
full precision whatever the compute dtype: each layer's full gradient is converted to
float32 first) or bfloat16 (the compute dtype's gradients reduced as the GEMMs wrote
them, half the bytes, the reduced shard converted to float32; microbatches still
accumulate in float32). Small parameters share one collective over a flat byte buffer (a bucket);
a parameter alone is a bucket of one. Parameters split over ``tp`` are never
flattened: a flat view of a ``tp``-split array would need the whole ``tp`` group's data.

``tp`` is automatic in the step, but a collective over a manual axis is opaque to
GSPMD, which would make its operand whole over ``tp`` first (all-gathering every
``tp``-split shard over ``tp`` before the ``sdp`` gather, and every full gradient before
the reduce-scatter). So each gather and reduce-scatter runs in a nested ``shard_map``
manual over ``tp`` as well, on the local ``tp`` slices (:func:`_over_tp`).
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

import collectives
from jaxsmp.nn.fp8 import Fp8Meta
from jaxsmp.nn.param import is_var

# Bucketing merges small parameters' collectives into one; a parameter whose gathered
# size exceeds this already fills a collective on its own, and copying it into and
# out of the flat buffer only costs memory traffic (cf. PyTorch DDP's bucket_cap_mb).
BUCKET_MAX_BYTES = 4 << 20


def mesh_axes(variable: nnx.Variable) -> tuple:
    return variable.get_metadata()["mesh_axes"]


def _sdp_dim(axes: tuple, ndim: int) -> int | None:
    offset = len(axes) - ndim  # 1 for a layer sliced out of a stack
    for i, dim in enumerate(axes[offset:]):
        if "sdp" in collectives.axis_names(dim):
            return i
    return None


def sdp_dim(variable: nnx.Variable) -> int | None:
    """The dimension of ``variable``'s value split over sdp (None: not split)."""
    return _sdp_dim(mesh_axes(variable), variable[...].ndim)


def tp_spec(variable: nnx.Variable) -> P | None:
    """Where ``variable``'s value is split over tp, as a spec naming only tp; None when
    its sdp dimension is split over tp too (a 1-D column-parallel bias): the step's
    ``shard_map`` makes each sdp block contiguous, so one tp slice of the gathered
    array would not be the sdp gather of this device's tp slices."""
    axes = mesh_axes(variable)
    axes = axes[len(axes) - variable[...].ndim:]
    dim = sdp_dim(variable)
    if dim is not None and "tp" in collectives.axis_names(axes[dim]):
        return None
    return P(*["tp" if "tp" in collectives.axis_names(d) else None for d in axes])


def _over_tp(fn: Callable, in_specs, out_specs: list[P | None]) -> Callable:
    """``fn`` manual over tp too, when the mesh has an automatic tp of size > 1 and every
    spec is known (see the module docstring); else ``fn``."""
    mesh = jax.sharding.get_abstract_mesh()
    if (mesh.empty or mesh.shape.get("tp", 1) == 1 or "tp" in mesh.manual_axes
            or any(s is None for s in out_specs)):
        return fn
    return jax.shard_map(fn, in_specs=in_specs, out_specs=out_specs, axis_names={"tp"})


def _gather_list(shards: list[jax.Array], flat: bool, algorithm: str) -> list[jax.Array]:
    if flat:
        return collectives.all_gather_tree(shards, "sdp", [0] * len(shards), algorithm)
    return [collectives.all_gather(x, "sdp", axis=0, algorithm=algorithm) for x in shards]


def _scatter_list(grads: list[jax.Array], flat: bool, algorithm: str) -> list[jax.Array]:
    if flat:
        return collectives.reduce_scatter_tree(grads, "sdp", [0] * len(grads), algorithm)
    return [collectives.reduce_scatter(g, "sdp", axis=0, algorithm=algorithm) for g in grads]


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4, 5))
def gather_shards(shards: list[jax.Array], dims: tuple[int, ...], dtype, algorithm: str,
                  flat: bool, reduce_dtype=jnp.float32) -> list[jax.Array]:
    """``shards`` cast to ``dtype`` and all-gathered over sdp along ``dims``: with
    ``flat`` one collective over their bytes, else one each; the gradient is the
    reduce-scatter in ``reduce_dtype``.

    Collectives run over the leading dimension, where each rank's block is contiguous;
    the full array comes back as a transposed view that XLA folds into its consumer,
    so only the 1/p shard is ever transposed, not the gathered array."""
    moved = [jnp.moveaxis(x.astype(dtype), d, 0) for x, d in zip(shards, dims)]
    return [jnp.moveaxis(x, 0, d) for x, d in zip(_gather_list(moved, flat, algorithm), dims)]


def _gather_fwd(shards, dims, dtype, algorithm, flat, reduce_dtype=jnp.float32):
    return (gather_shards(shards, dims, dtype, algorithm, flat, reduce_dtype),
            [jnp.zeros((0,), x.dtype) for x in shards])


def summed_in(collective: Callable, x):
    """``collective(x)``, a summing collective of an array or list of arrays, in their
    dtypes. XLA:CPU sums a bf16
    collective in float32 and rounds the result (its AllReducePromotion), and aborts
    doing so inside a map manual over only some axes (jax 0.10.2, with tp): on CPU
    meshes that arithmetic is written out here; elsewhere the collective runs as is."""
    mesh = collectives.context.current().mesh
    if (all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(x)) or mesh is None
            or mesh.devices.flat[0].platform != "cpu"):
        return collective(x)
    summed = collective(jax.tree.map(lambda leaf: leaf.astype(jnp.float32), x))
    return jax.tree.map(lambda s, leaf: s.astype(leaf.dtype), summed, x)


def _gather_bwd(dims, dtype, algorithm, flat, reduce_dtype, dtype_carriers, cotangents):
    moved = [jnp.moveaxis(c.astype(reduce_dtype), d, 0) for c, d in zip(cotangents, dims)]
    summed = summed_in(lambda m: _scatter_list(m, flat, algorithm), moved)
    return ([jnp.moveaxis(s, 0, d).astype(c.dtype)
             for s, d, c in zip(summed, dims, dtype_carriers)],)


gather_shards.defvjp(_gather_fwd, _gather_bwd)


def exchange(x: jax.Array, split: int, concat: int) -> jax.Array:
    """An all-to-all over sdp: ``x``'s dimension ``split`` cut into p blocks, block j
    sent to device j, the blocks received concatenated along ``concat`` in device order.
    The blocks are exchanged on a leading axis and rearranged by explicit transposes:
    an all-to-all that splits an inner dimension makes XLA:GPU ask its operand for a
    layout with that dimension major, which layout assignment pushes back into the
    parameter stacks (and their optimizer update)."""
    p = jax.lax.axis_size("sdp")
    shape = x.shape
    blocks = x.reshape(*shape[:split], p, shape[split] // p, *shape[split + 1:])
    got = jax.lax.all_to_all(jnp.moveaxis(blocks, split, 0), "sdp", 0, 0, tiled=True)
    rest = list(got.shape[1:])
    rest[concat] *= p
    return jnp.moveaxis(got, 0, concat).reshape(rest)


def to_split(value: jax.Array, sdp_dim: int, target: int, dtype) -> jax.Array:
    """A shard split on ``sdp_dim`` moved to a split on ``target``, in ``dtype``; its
    gradient is :func:`from_split` (autodiff of the all-to-all)."""
    value = value.astype(dtype)
    return value if sdp_dim == target else exchange(value, target, sdp_dim)


def from_split(grad: jax.Array, sdp_dim: int, target: int, dtype) -> jax.Array:
    """:func:`to_split`'s transpose: a gradient split on ``target`` back to the shard's
    split on ``sdp_dim``, in ``dtype`` (no sum: it already holds the group's tokens)."""
    return (grad if sdp_dim == target else exchange(grad, sdp_dim, target)).astype(dtype)


def _bucketable(var: nnx.Variable, dtype) -> bool:
    """Small, and not split over tp (a flat view would need the whole tp group's data)."""
    value = var[...]
    gathered = value.size * jax.lax.axis_size("sdp") * jnp.dtype(dtype).itemsize
    return gathered <= BUCKET_MAX_BYTES and not any("tp" in collectives.axis_names(d) for d in mesh_axes(var))


def _groups(variables: list, dtype, select, bucket: bool,
            moved=lambda v: None) -> tuple[list[int], list[list[int]]]:
    """(indices only cast to ``dtype``, groups of indices gathered together): selected
    float parameters not split over sdp are only cast; split ones share one bucket when
    :func:`_bucketable`, else go alone; those ``moved`` names a dimension for are in
    neither (:func:`to_split`). fp8 amax histories stay float32 and local."""
    cast, split = [], []
    for i, v in enumerate(variables):
        if (select(v) and jnp.issubdtype(v[...].dtype, jnp.floating)
                and not isinstance(v, Fp8Meta) and moved(v) is None):
            (split if sdp_dim(v) is not None else cast).append(i)
    flat = [i for i in split if bucket and _bucketable(variables[i], dtype)]
    return cast, ([flat] if flat else []) + [[i] for i in split if i not in flat]


def gather_tree(state: nnx.State, dtype, algorithm: str,
                select: Callable[[nnx.Variable], bool] = lambda v: True,
                bucket: bool = False, reduce_dtype=jnp.float32,
                split: Callable[[nnx.Variable], int | None] = lambda v: None) -> nnx.State:
    """The selected float parameters of ``state`` in ``dtype``, gathered over sdp: one
    collective each, or with ``bucket`` one for all that :func:`_bucketable` admits;
    those ``split`` names a dimension for are moved to a split on it instead
    (:func:`to_split`, activation gathering). Differentiable: the gradient is
    :func:`scatter_tree`'s reduce-scatter (in ``reduce_dtype``)."""
    variables, treedef = jax.tree.flatten(state, is_leaf=is_var)
    out = list(variables)
    moved = lambda v: split(v) if select(v) and not isinstance(v, Fp8Meta) else None
    cast, groups = _groups(variables, dtype, select, bucket, moved)
    for i in cast:
        out[i] = variables[i].replace(variables[i][...].astype(dtype))
    for i, v in enumerate(variables):
        if moved(v) is not None:
            out[i] = v.replace(to_split(v[...], sdp_dim(v), moved(v), dtype))
    for group in groups:
        dims = tuple(sdp_dim(variables[i]) for i in group)
        specs = [tp_spec(variables[i]) for i in group]
        gather = _over_tp(
            lambda s: gather_shards(s, dims, dtype, algorithm, len(s) > 1, reduce_dtype),
            (specs,), specs)
        full = gather([variables[i][...] for i in group])
        for i, value in zip(group, full):
            out[i] = variables[i].replace(value)
    return jax.tree.unflatten(treedef, out)


def scatter_tree(grads: nnx.State, shards: nnx.State, dtype, algorithm: str,
                 bucket: bool = False, reduce_dtype=jnp.float32,
                 split: Callable[[nnx.Variable], int | None] = lambda v: None) -> nnx.State:
    """Gradients of :func:`gather_tree`'s output (``grads``, full size) reduced to the
    parameter shards ``shards`` hold: reduce-scatters over sdp in ``reduce_dtype``, grouped as the
    gather was, and :func:`from_split` for those ``split`` moved, cast to the shards'
    dtypes (the transpose of ``gather_tree``, run by hand where the step writes the
    backward pass itself)."""
    variables, treedef = jax.tree.flatten(shards, is_leaf=is_var)
    values = [g[...] if is_var(g) else g for g in treedef.flatten_up_to(grads)]
    out = [v.replace(values[i] if isinstance(v, Fp8Meta)  # amax observations pass as they are
                     else jnp.zeros_like(v[...])) for i, v in enumerate(variables)]  # non-float
    moved = lambda v: None if isinstance(v, Fp8Meta) else split(v)
    cast, groups = _groups(variables, dtype, lambda v: True, bucket, moved)
    for i in cast:
        out[i] = variables[i].replace(values[i].astype(variables[i][...].dtype))
    for i, v in enumerate(variables):
        if moved(v) is not None:
            out[i] = v.replace(from_split(values[i], sdp_dim(v), moved(v), v[...].dtype))
    for group in groups:
        dims = tuple(sdp_dim(variables[i]) for i in group)
        specs = [tp_spec(variables[i]) for i in group]
        scatter = _over_tp(
            lambda shards, g: _gather_bwd(dims, dtype, algorithm, len(g) > 1, reduce_dtype,
                                          shards, g)[0],
            (specs, specs), specs)
        summed = scatter([variables[i][...] for i in group], [values[i] for i in group])
        for i, value in zip(group, summed):
            out[i] = variables[i].replace(value)
    return jax.tree.unflatten(treedef, out)
