"""The amax histories of ``precision="fp8"`` as training state, and their reductions.

:func:`with_fp8` gives every :class:`~jaxsmp.nn.Linear` (the vocabulary projection
only with ``vocab=True``) an :class:`~jaxsmp.nn.fp8.Fp8Meta` of zeros, stacked like its
kernel (so pipeline stages, the layer scan and checkpoints carry it as they carry the
kernel), replicated on every other mesh axis. The optimizer never sees it
(:func:`trainable`); the step replaces it by the history rolled with the step's
observed amaxes (:func:`roll_histories`).

The observations come back as the histories' cotangents (:mod:`jaxsmp.nn.fp8`), and
every repeat of a matmul must combine them with a maximum where gradients are summed:
microbatches (:func:`microbatch_gradients`), a pipeline's ticks (the Stack's
``max_accumulating`` cast; 1F1B's own accumulation), data replicas
(:func:`jaxsmp.train.manual.sum_over_replicas` takes ``pmax``). ``tp`` and ``cp``
are GSPMD's: the amax of a split tensor is already the global one.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from jaxsmp.checks import positive_int
from jaxsmp.nn.fp8 import DEFAULT_HISTORY, ROWS, Fp8Meta, roll_history
from jaxsmp.nn.linear import Linear
from jaxsmp.nn.param import is_var, logical_axes

FP8_CAPABILITY = (8, 9)  # Ada and Hopper have FP8 tensor cores; Ampere (8.0) does not


def is_meta(x) -> bool:
    return isinstance(x, Fp8Meta)


def has_fp8(params: nnx.State) -> bool:
    return any(is_meta(v) for v in jax.tree.leaves(params, is_leaf=is_var))


def trainable(params: nnx.State) -> nnx.State:
    """``params`` without amax histories: what the optimizer updates."""
    return nnx.filter_state(params, nnx.Param) if has_fp8(params) else params


def _meta(kernel: nnx.Variable, history: int, abstract: bool, mesh) -> Fp8Meta:
    lead = kernel.shape[:-2]
    axes = tuple(kernel.get_metadata()["mesh_axes"])[:-2] + (None, None)
    shape = (*lead, len(ROWS), history)
    sharding = mesh.sharding(P(*axes))
    value = (jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding) if abstract
             else jax.device_put(jnp.zeros(shape, jnp.float32), sharding))
    return Fp8Meta(value, out_sharding=logical_axes(kernel)[:-2] + (None, None),
                   eager_sharding=False,
                   mesh_axes=axes)


def runs_fp8(module: Any, vocab: bool = False) -> bool:
    """Whether ``module`` is a Linear that fp8 runs in float8 (and gives a history): every
    one but the vocabulary projection, which only ``vocab=True`` includes."""
    return isinstance(module, Linear) and (vocab or logical_axes(module.kernel)[-1] != "vocab")


def with_fp8(state, history: int = DEFAULT_HISTORY, vocab: bool = False):
    """``state`` (concrete or abstract) whose Linears carry zero amax histories of
    length ``history`` (the vocabulary projection's with ``vocab``); a state that has
    them already is returned as it is, if they are those."""
    positive_int("fp8_history", history)
    model = nnx.merge(state.graphdef, state.params)
    if vocab and not any(runs_fp8(m, vocab) and not runs_fp8(m)
                         for _, m in nnx.iter_modules(model)):
        raise ValueError(
            "fp8_vocab=True runs the vocabulary projection Linear in float8, but this "
            f"model ({type(model).__name__}) has none: its logits come from its tied token "
            "embedding, which stays in bfloat16; use fp8_vocab=False")
    if has_fp8(state.params):
        _check_histories(model, history, vocab)
        return state
    abstract = all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(state.params))
    for _, module in nnx.iter_modules(model):
        if runs_fp8(module, vocab):
            module.fp8 = nnx.data(_meta(module.kernel, history, abstract, state.mesh))
    graphdef, params = nnx.split(model, nnx.Any(nnx.Param, Fp8Meta))
    return state.replace(graphdef=graphdef, params=params)


def _check_histories(model, history: int, vocab: bool) -> None:
    """Refuses a state whose histories are not those ``history`` and ``vocab`` ask for
    (e.g. restored from a run with other fp8 settings)."""
    modules = dict(nnx.iter_modules(model))
    want = {path for path, m in modules.items() if runs_fp8(m, vocab)}
    have = {path for path, m in modules.items() if getattr(m, "fp8", None) is not None}
    lengths = {modules[path].fp8.shape[-1] for path in have}
    if have != want or lengths != {history}:
        raise ValueError(
            f"the state holds fp8 histories of length {sorted(lengths)} on {len(have)} "
            f"Linears, but fp8_history={history}, fp8_vocab={vocab} asks for length "
            f"{history} on {len(want)}; use the fp8 settings the state was made with")


def roll_histories(params: nnx.State, grads: nnx.State) -> nnx.State:
    """``params`` with each history rolled by its observation (column 0 of its
    cotangent in ``grads``, already max-reduced); parameters unchanged."""
    def roll(p, g):
        return p.replace(roll_history(p[...], jnp.maximum(g[..., 0], 0.0))) if is_meta(p) else p
    return jax.tree.map(roll, params, grads, is_leaf=is_var)


def microbatch_gradients(plan, forward, params: nnx.State, batch: Any, coef, **kw):
    """``plan.gradients`` one microbatch at a time (``pp == 1``): parameter gradients
    summed, amax observations combined with a maximum (a sum would add them)."""
    from jaxsmp.pipeline.microbatch import one_at_a_time, split_microbatches
    m = plan.microbatches
    one = dataclasses.replace(plan, microbatches=1)

    def micro(acc, mbatch):
        acc, mbatch = one_at_a_time(acc, mbatch)
        grads, loss, metrics = one.gradients(forward, params, mbatch, coef / m, **kw)
        combine = lambda a, g: a.replace(jnp.maximum(a[...], g[...]) if is_meta(a)
                                         else a[...] + g[...])
        return jax.tree.map(combine, acc, grads, is_leaf=is_var), (loss, metrics)

    zeros = jax.tree.map(lambda x: jnp.zeros_like(x, jnp.float32), params)
    grads, (losses, metrics) = jax.lax.scan(micro, zeros, split_microbatches(batch, m))
    return grads, losses.mean(), jax.tree.map(lambda x: x.mean(0), metrics)


def check_fp8(mesh, options) -> None:
    """Refuses, before compiling, GPUs without FP8 tensor cores."""
    device = mesh.jax_mesh.devices.flat[0]
    capability = getattr(device, "compute_capability", None)
    if device.platform in ("gpu", "cuda") and capability is not None:
        if tuple(int(x) for x in str(capability).split(".")) < FP8_CAPABILITY:
            raise ValueError(
                f"precision='fp8' needs FP8 tensor cores (compute capability >= 8.9: H100, "
                f"H200, L4, L40); the mesh's {device.device_kind} has {capability}; use "
                f"precision='bf16'")
