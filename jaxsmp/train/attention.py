"""Attention inside the step: the kernel runs on each device's local batch and heads.

The step is manual over the data and pipeline axes, and ``tp`` is automatic, so a
kernel called there would be partitioned by GSPMD: a Triton custom call is opaque to it
(its operands made whole over ``tp`` first, every device computing every head), and
JAX's cuDNN attention brings a custom partitioner that fails inside the step's
``shard_map`` (an ``AssertionError`` in ``get_num_ways_dim_sharded`` on ``sdp=8``, an
``AttributeError`` on ``sdp=4, tp=2``, both found by the deviceless XLA:GPU compile of
``tests/jaxsmp/test_gpu_compile.py``). Attention needs no communication once heads are
split over ``tp``, so :func:`local_attention` calls the kernel in a nested
``shard_map`` manual over every remaining mesh axis, on ``[local batch, seq, heads /
tp, head_dim]`` (on the batch instead where ``tp`` does not divide the heads): no
partitioner runs. ``impl="auto"`` decides for the platform of the
mesh's devices, not JAX's default backend (a step compiled for GPUs on a CPU host gets
the GPU kernel).

With ``tp = 1`` the step is manual over every mesh axis (:attr:`jaxsmp.Mesh.manual_axes`)
and the kernel is called as it is. With ``pp > 1`` and ``tp > 1`` together a per-device
kernel is refused and ``auto`` runs ``blockwise``: inside the pipeline's loop JAX 0.10
partially evaluates the nested ``shard_map`` and gives the constants it hoists out of
it a sharding that XLA's verifier rejects (manual axes out of order).
"""
from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import pallas_kernels
from jaxsmp.context import RING_IMPLS, decide_strategy
from jaxsmp.context.ring import ring_attention
from jaxsmp.context.ulysses import check_heads, ulysses_attention
from jaxsmp.train.explain import note
from pallas_kernels.attention import choose_impl, decide_impl


def _split_over_tp(q: jax.Array, tp: int) -> str | None:
    """What the kernel's calls are split on over ``tp``: ``heads`` when ``tp`` divides
    the query heads (Megatron's layout), else ``batch`` when it divides the local batch,
    else nothing (each ``tp`` device runs every head of its batch)."""
    if tp == 1:
        return None
    if q.shape[2] % tp == 0:
        return "heads"
    return "batch" if q.shape[0] % tp == 0 else None


def _repeat_kv(k: jax.Array, v: jax.Array, tp: int, heads: int):
    """k, v with their heads repeated (grouped-query attention) until ``tp`` divides
    them: each device then holds the kv heads its query heads read."""
    kv = k.shape[2]
    if kv % tp == 0:
        return k, v
    reps = heads // kv
    return jnp.repeat(k, reps, axis=2), jnp.repeat(v, reps, axis=2)


def _per_device(fn: Callable, mesh, free: tuple[str, ...], qkv: P, extra_specs) -> Callable:
    """``fn(q, k, v, extra)`` in a ``shard_map`` manual over ``free``, differentiated by
    hand: JAX's own partial evaluation of a ``shard_map`` nested in the step's splits its
    residuals over the enclosing manual axes too (a shape mismatch under ``tp``), so the
    forward returns the kernel's residuals itself, each with a leading axis split over
    ``free`` (one slot per device), and the backward takes them back."""
    names = tuple(a for a in free if mesh.shape[a] > 1) or None
    one_each = P(names)

    def mapped(body, in_specs, out_specs):
        return jax.shard_map(body, mesh=mesh, axis_names=set(free), in_specs=in_specs,
                             out_specs=out_specs)

    @jax.custom_vjp
    def run(q, k, v, extra):
        return mapped(fn, (qkv, qkv, qkv, extra_specs), qkv)(q, k, v, extra)

    tree = []

    def forward(q, k, v, extra):
        def local(q, k, v, extra):
            out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, extra), q, k, v)
            leaves, treedef = jax.tree.flatten(vjp)
            tree[:] = [treedef]
            return out, [x[None] for x in leaves]
        out, residuals = mapped(local, (qkv, qkv, qkv, extra_specs), (qkv, one_each))(
            q, k, v, extra)
        return out, (residuals, extra)

    def backward(saved, d_out):
        residuals, extra = saved

        def local(residuals, d_out):
            vjp = jax.tree.unflatten(tree[0], [x[0] for x in residuals])
            return vjp(d_out)
        grads = mapped(local, (one_each, qkv), (qkv, qkv, qkv))(residuals, d_out)
        return (*grads, jax.tree.map(lambda _: None, extra))

    run.defvjp(forward, backward)
    return run


def _kernel(q, k, v, *, why: str | None = None, **kwargs) -> jax.Array:
    """``pallas_kernels.attention`` with ``auto`` resolved here, on the inputs the kernel
    gets, and the implementation that runs noted for ``step.explain``
    (:mod:`jaxsmp.train.explain`); ``why``: the reason for an ``impl`` set by a rule."""
    impl = kwargs.get("impl", "auto")
    if impl == "auto":
        b, s, h, d = q.shape
        impl, why = decide_impl(q.dtype, d, alibi=kwargs.get("alibi_slopes") is not None,
                                segments=kwargs.get("segment_ids") is not None,
                                platform=kwargs["platform"], score_bytes=b * h * s * s * 4)
    note("attention", impl, why)
    return pallas_kernels.attention(q, k, v, **{**kwargs, "impl": impl})


def _per_device_kernel(q, alibi_slopes, segment_ids, kwargs) -> bool:
    """Whether the call runs a kernel GSPMD cannot partition (Pallas, cuDNN), which then
    runs per device; ``reference`` and ``blockwise`` are plain XLA ops that GSPMD splits
    over ``tp`` by itself."""
    impl = kwargs.get("impl", "auto")
    if impl == "auto":
        b, s, h, d = q.shape
        impl = choose_impl(q.dtype, d, alibi=alibi_slopes is not None,
                                          segments=segment_ids is not None,
                                          platform=kwargs["platform"], score_bytes=b * h * s * s * 4)
    return impl in ("pallas", "cudnn")


def _context_kernel(strategy: str, q, tp: int, cp: int, segments: bool, kwargs) -> Callable:
    """The per-device attention of a ``cp`` mesh: ``ulysses`` or ``ring`` (``auto``:
    :func:`jaxsmp.context.decide_strategy`)."""
    impl, why = kwargs.get("impl", "auto"), None
    if strategy == "auto":
        ring_ok = bool(kwargs.get("causal")) and not segments and impl in RING_IMPLS
        strategy, why = decide_strategy(q.shape[2], cp, tp, kwargs["platform"], ring_ok)
    note("context_parallel", strategy, why)
    if strategy == "ulysses":
        check_heads(q.shape[2], cp, tp)
        return lambda q, k, v, extra: ulysses_attention(_kernel, q, k, v, **extra, **kwargs)
    if impl not in RING_IMPLS or not kwargs.get("causal") or segments:
        raise ValueError(f"context_parallel='ring' runs causal attention without segment ids "
                         f"(packed sequences), its blocks in XLA; got impl={impl!r}, "
                         f"causal={kwargs.get('causal')!r}, segment ids: {segments}. Use "
                         f"attention_impl 'auto' (or 'blockwise'), or context_parallel='ulysses'")
    note("attention", "blockwise", f"ring attention runs its chunk pairs as XLA "
         f"FlashAttention tiles (pallas_kernels.blockwise), whatever impl={impl!r} asks")
    scale = kwargs.get("softmax_scale") or q.shape[3] ** -0.5
    return lambda q, k, v, extra: ring_attention(q, k, v, extra.get("alibi_slopes"), scale)


def local_attention(mesh: jax.sharding.Mesh,
                    context_parallel: str = "auto") -> Callable[..., jax.Array]:
    """``pallas_kernels.attention`` per device on ``mesh`` (see the module docstring);
    on a ``cp`` mesh through the ``context_parallel`` strategy."""
    platform = mesh.devices.flat[0].platform

    def attend(q, k, v, *, alibi_slopes=None, segment_ids=None, **kwargs):
        kwargs.setdefault("platform", platform)
        context = jax.sharding.get_abstract_mesh()
        manual = set(context.manual_axes) if not context.empty else set()
        free = tuple(a for a in mesh.axis_names if a not in manual)
        extra = {name: x for name, x in (("alibi_slopes", alibi_slopes),
                                         ("segment_ids", segment_ids)) if x is not None}
        cp = mesh.shape["cp"] if "cp" in free else 1
        if cp == 1 and (not free or not _per_device_kernel(q, alibi_slopes, segment_ids,
                                                             kwargs)):
            return _kernel(q, k, v, **extra, **kwargs)
        if "pp" in manual and kwargs.get("impl", "auto") == "auto":
            # the rule of auto on such meshes (see the module docstring)
            return _kernel(q, k, v, **extra, **{**kwargs, "impl": "blockwise"}, why=(
                f"pp={mesh.shape['pp']} with tp={mesh.shape['tp']}: inside the pipeline's "
                f"loop JAX mis-shards a cuDNN or Pallas kernel mapped per device over tp, "
                f"so auto runs XLA's blockwise FlashAttention"))
        if "pp" in manual:
            raise ValueError(
                f"attention impl {kwargs['impl']!r} (a Pallas or cuDNN kernel) is not "
                f"supported with pipeline and tensor parallelism together (pp > 1 and tp > 1): "
                f"inside the pipeline's loop JAX mis-shards a kernel mapped over tp. Use "
                f"attention_impl='blockwise' or 'auto', or a mesh with tp=1 or pp=1")
        tp = mesh.shape["tp"] if "tp" in free else 1
        split = _split_over_tp(q, tp)
        if split == "heads":
            k, v = _repeat_kv(k, v, tp, q.shape[2])
        on = lambda dim: "tp" if split == dim else None
        specs = {"alibi_slopes": P(on("heads")), "segment_ids": P(on("batch"))}

        def kernel(q, k, v, extra):
            return _kernel(q, k, v, **extra, **kwargs)
        if cp > 1:
            kernel = _context_kernel(context_parallel, q, tp if split == "heads" else 1, cp,
                                     segment_ids is not None, kwargs)
            specs["segment_ids"] = P(on("batch"), "cp")
        run = _per_device(kernel, context if not context.empty else mesh, free,
                          P(on("batch"), "cp" if cp > 1 else None, on("heads"), None),
                          {n: specs[n] for n in extra})
        return run(q, k, v, extra)
    return attend
