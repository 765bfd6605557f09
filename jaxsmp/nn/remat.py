"""Activation-checkpointing policies by name, applied to each stacked layer."""
from __future__ import annotations

from collections.abc import Callable

import jax
from jax.ad_checkpoint import checkpoint_name

POLICIES = ("none", "full", "save_qkv", "save_matmuls", "offload")
# the name attention layers give their q, k, v projections' outputs (``checkpoint_name``),
# which ``save_qkv`` keeps (MaxText's ``save_qkv_proj``)
QKV_NAME = "qkv_proj"


def name_qkv(x: jax.Array) -> jax.Array:
    """``x``, a q, k or v projection's output, named for the ``save_qkv`` policy."""
    return checkpoint_name(x, QKV_NAME)


def _offload_policy() -> Callable:
    kinds = {m.kind for m in jax.devices()[0].addressable_memories()}
    if "pinned_host" not in kinds:
        raise ValueError(f"remat='offload' needs pinned host memory; backend "
                         f"{jax.default_backend()!r} has only {sorted(kinds)}")
    return jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host")


HOST_MEMORY_SPACE = "S(5)"  # XLA's layout annotation of buffers in host memory


def check_offloads(compiled_hlo: str) -> None:
    """Raises if a step compiled with ``remat="offload"`` keeps nothing in host memory:
    some backends (XLA:CPU) accept the offload policy and drop it when compiling."""
    if HOST_MEMORY_SPACE not in compiled_hlo:
        raise ValueError(
            f"remat='offload': the compiled step on backend {jax.default_backend()!r} keeps "
            f"no buffer in host memory (XLA drops the offload here), so it would run as "
            f"remat='save_matmuls' without the memory saving; use 'save_matmuls' or 'full' "
            f"on this backend")


def remat(fn: Callable, policy: str) -> Callable:
    """Wraps a layer body: ``none`` keeps all activations, ``full`` recomputes the
    layer in the backward pass, ``save_qkv`` recomputes all but the q, k, v projections
    (their outputs kept: :func:`name_qkv`), ``save_matmuls`` keeps only matmul outputs,
    ``offload`` moves matmul outputs to host memory and back. Whatever the policy,
    inside a step a layer's gathered parameters are never kept for the backward pass:
    :func:`jaxsmp.train.layer_scan.zero3_scan` drops them from the residuals and
    gathers them again (ZeRO-3's reshard after forward)."""
    if policy == "none":
        return fn
    if policy == "full":
        return jax.checkpoint(fn, prevent_cse=False)
    if policy == "save_qkv":
        return jax.checkpoint(fn, prevent_cse=False,
                              policy=jax.checkpoint_policies.save_only_these_names(QKV_NAME))
    if policy == "save_matmuls":
        return jax.checkpoint(fn, prevent_cse=False,
                              policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
    if policy == "offload":
        return jax.checkpoint(fn, prevent_cse=False, policy=_offload_policy())
    raise ValueError(f"unknown remat policy {policy!r}; valid: {POLICIES}")
