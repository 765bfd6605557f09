"""The user's loss on one device's parameter shards, inside the step's ``shard_map``.

Top-level parameters are gathered over ``sdp`` once per call; stacked layers are
gathered one at a time inside the :class:`~jaxsmp.nn.Stack`'s scan
(:func:`~jaxsmp.train.layer_scan.zero3_scan`, installed through the
:class:`~jaxsmp.nn.LayerContext` with the remat policy and prefetch, and with
``sequence_parallel`` the sequence split of :mod:`jaxsmp.train.sequence_parallel`), which also
carries the pipeline's stage runner and the sharded embedding lookup.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxsmp.context.sequence import over_context
from jaxsmp.mesh import DATA_AXES
from jaxsmp.nn.layer_context import LayerContext, layer_context
from jaxsmp.nn.param import is_var
from jaxsmp.nn.stack import is_stacked
from jaxsmp.pipeline import vma
from jaxsmp.train import activation_gather
from jaxsmp.train.attention import local_attention
from jaxsmp.train.embed_lookup import is_lookup_table, lookup_hook
from jaxsmp.train.layer_scan import zero3_scan
from jaxsmp.train.options import StepOptions
from jaxsmp.train.param_gather import gather_tree, scatter_tree, sdp_dim
from jaxsmp.train.precision import precision_policy
from jaxsmp.train.sequence_parallel import over_sequence

LossFn = Callable[[nnx.Module, Any], jax.Array | tuple[jax.Array, dict]]


def _attention(mesh, context_parallel: str, impl: str | None) -> Callable:
    attend = local_attention(mesh, context_parallel)
    if impl is None:
        return attend
    return lambda q, k, v, **kwargs: attend(q, k, v, **{**kwargs, "impl": impl})


def _sum_over_data(tree: Any) -> Any:
    """``tree``'s per-device values summed over the manual data axes (each made varying
    over all of them first: a psum takes one type over its axes)."""
    axes = frozenset(DATA_AXES) & frozenset(jax.sharding.get_abstract_mesh().manual_axes)
    if not axes:
        return tree
    names = tuple(a for a in DATA_AXES if a in axes)
    return jax.tree.map(lambda x: jax.lax.psum(vma.vary(x, axes), names), tree)


def local_forward(fn: LossFn, graphdef: nnx.GraphDef, options: StepOptions,
                  collectives_name: str, mesh: jax.sharding.Mesh,
                  attention_impl: str | None = None) -> Callable:
    """``forward(params, batch, stage_runner) -> (float32 loss, float32 metrics)`` on
    ``mesh``'s devices; ``attention_impl`` overrides the model's attention kernel (the
    pipeline's costing compiles a GPU model's pieces on the host with ``reference``)."""
    dtype, fp8 = precision_policy(options.precision).compute_dtype, precision_policy(
        options.precision).fp8
    platform = mesh.devices.flat[0].platform

    def forward(params: nnx.State, batch: Any, stage_runner=None):
        # Embed tables sharded on their columns are looked up from their shards (no
        # table gather); their gathered values stay available to other readers, one
        # gather each, which XLA drops when unused (see jaxsmp.train.embed_lookup)
        tables = {id(v) for v in jax.tree.leaves(params, is_leaf=is_var)
                  if not is_stacked(v) and is_lookup_table(v, sdp_dim)}
        reduce = options.reduce_jnp_dtype
        split = activation_gather.for_step(options, dict(mesh.shape), params, batch)
        move = functools.partial(activation_gather.target_dim, split=split)
        top = gather_tree(params, dtype, collectives_name,
                          select=lambda v: not is_stacked(v) and id(v) not in tables,
                          bucket=options.bucket, reduce_dtype=reduce, split=move)
        top = gather_tree(top, dtype, collectives_name, select=lambda v: id(v) in tables,
                          reduce_dtype=reduce)
        scan = functools.partial(
            zero3_scan, remat=options.remat, prefetch=options.prefetches(platform),
            branchless=mesh.shape["tp"] > 1,  # GSPMD's tp collectives sit inside a layer
            kept=lambda w: [move(v) is not None for v in jax.tree.leaves(w, is_leaf=is_var)],
            gather=lambda s: gather_tree(s, dtype, collectives_name, bucket=options.bucket,
                                         reduce_dtype=reduce, split=move),
            scatter=lambda g, s: scatter_tree(g, s, dtype, collectives_name, options.bucket,
                                              reduce, split=move))
        cp = mesh.shape["cp"]
        if cp > 1:
            scan = over_context(scan, mesh, cp, ("cp", "tp") if options.sequence_parallel
                                else ("cp",))
        elif options.sequence_parallel:
            scan = over_sequence(scan, mesh)
        ctx = LayerContext(scan_layers=scan, run_stages=stage_runner,
                           embed_lookup=lookup_hook(params, top, tables, dtype),
                           attention=_attention(mesh, options.context_parallel,
                                                attention_impl),
                           fp8=fp8, expert_axis="ep" if mesh.shape["ep"] > 1 else None,
                           sum_over_data=_sum_over_data,
                           linear=functools.partial(activation_gather.split_linear, split))
        with layer_context(ctx):
            out = fn(nnx.merge(graphdef, top), batch)
        loss, metrics = out if isinstance(out, tuple) else (out, {})
        return (loss.astype(jnp.float32),
                {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()})
    return forward
