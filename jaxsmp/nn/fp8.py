"""FP8 matmuls with delayed scaling (Transformer Engine's recipe, as Flax's ``fp8_ops``).

A :class:`~jaxsmp.nn.Linear` that holds an :class:`Fp8Meta` runs :func:`fp8_dot` when
the step asks for it (``precision="fp8"``): its input and kernel are quantized to
``float8_e4m3fn``, the gradient of its output to ``float8_e5m2``, each with a per-tensor
scale from the largest absolute value seen in the last ``history`` steps (the amax
history, one row per tensor, newest first); the three GEMMs (forward, input gradient,
kernel gradient) take float8 operands, their outputs are in the compute dtype.

Each operand is dequantized (converted back and multiplied by its scalar scale) right
before its dot: that is the pattern XLA's GPU GEMM rewriter turns into one cuBLASLt
FP8 GEMM with the scales folded in; on CPUs XLA runs the same graph in emulation.

The amaxes observed in a step leave through the backward pass: the cotangent of the
history is the observation ``[amax(x), amax(kernel), amax(dy)]`` in column 0 and zeros
elsewhere. Summing such cotangents (what autodiff and data parallelism do to
gradients) would be wrong; the step reduces them with a maximum
(:mod:`jaxsmp.train.fp8_state`) and rolls them into the history.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

FORWARD_DTYPE = jnp.float8_e4m3fn   # activations and weights
BACKWARD_DTYPE = jnp.float8_e5m2    # output gradients: more range, less precision
ROWS = ("input", "kernel", "output_grad")
DEFAULT_HISTORY = 1024


class Fp8Meta(nnx.Variable):
    """Amax histories ``[..., 3, history]`` (rows :data:`ROWS`): state the optimizer
    never sees and the step overwrites; checkpointed with the parameters."""


def fp8_max(dtype) -> float:
    return float(jnp.finfo(dtype).max)


def scale_from_history(history: jax.Array, dtype) -> jax.Array:
    """The dequantization scale ``amax / fp8_max`` of each row's largest amax; 1 where
    the history holds no positive finite amax yet."""
    amax = jnp.max(history, axis=-1)
    known = (amax > 0) & jnp.isfinite(amax)
    return jnp.where(known, amax / fp8_max(dtype), 1.0).astype(jnp.float32)


def roll_history(history: jax.Array, amax: jax.Array) -> jax.Array:
    """``amax`` (one per row) becomes the newest entry; the oldest one is dropped."""
    return jnp.concatenate([amax[..., None].astype(history.dtype), history[..., :-1]], -1)


def quantize(x: jax.Array, dtype, scale: jax.Array) -> jax.Array:
    """``x / scale`` clipped to ``dtype``'s range, in ``dtype``."""
    top = fp8_max(dtype)
    return jnp.clip(x.astype(jnp.float32) / scale, -top, top).astype(dtype)


def dequantize(q: jax.Array, scale: jax.Array, dtype) -> jax.Array:
    """``q`` in ``dtype`` times its scalar scale: the operand form of an FP8 GEMM."""
    return q.astype(dtype) * scale.astype(dtype)


def _amax(x: jax.Array) -> jax.Array:
    return jnp.max(jnp.abs(x)).astype(jnp.float32)


def _dot(x: jax.Array, kernel: jax.Array, dtype) -> jax.Array:
    return jnp.einsum("...i,io->...o", x, kernel, preferred_element_type=dtype)


def _scales(history: jax.Array):
    return (scale_from_history(history[0], FORWARD_DTYPE),
            scale_from_history(history[1], FORWARD_DTYPE),
            scale_from_history(history[2], BACKWARD_DTYPE))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def fp8_dot(x: jax.Array, kernel: jax.Array, history: jax.Array, dtype) -> jax.Array:
    """``x @ kernel`` (``[..., i] @ [i, o]``, both in ``dtype``) with float8 operands
    scaled by ``history`` (``[3, n]``), the result in ``dtype``."""
    sx, sw, _ = _scales(history)
    return _dot(dequantize(quantize(x, FORWARD_DTYPE, sx), sx, dtype),
                dequantize(quantize(kernel, FORWARD_DTYPE, sw), sw, dtype), dtype)


def _fp8_dot_fwd(x, kernel, history, dtype):
    sx, sw, sg = _scales(history)
    qx = quantize(x, FORWARD_DTYPE, sx)
    y = _dot(dequantize(qx, sx, dtype),
             dequantize(quantize(kernel, FORWARD_DTYPE, sw), sw, dtype), dtype)
    # the kernel itself is saved, not its float8 copy: the step recognises a gathered
    # weight among the residuals by identity and gathers it again instead of keeping it.
    # So is x (shared by the Linears reading it, e.g. q, k, v): one bf16 buffer, where
    # each Linear's float8 copy (its own scale) would be one more
    return y, (x, kernel, history, sx, sw, sg, _amax(x), _amax(kernel))


def _fp8_dot_bwd(dtype, residuals, dy):
    x, kernel, history, sx, sw, sg, amax_x, amax_w = residuals
    # FP8 GEMMs take both operands contracting-dim minor, so each float8 operand is
    # made in the layout of its one GEMM. Without the barriers XLA fuses the kernel's
    # copies (forward's, transposed, and this one) and dy's (dgrad's and wgrad's,
    # transposed) into multi-output fusions that keep them all live at once: Llama 7B
    # width, sdp=4 tp=2, 1.43x bf16's temporaries (1.06x with them). The first makes
    # this kernel copy after the forward's is dead, the second wgrad's after dgrad.
    kernel, dy = jax.lax.optimization_barrier((kernel, dy))
    amax_dy = _amax(dy)
    gq = quantize(dy, BACKWARD_DTYPE, sg)
    qw = dequantize(quantize(kernel, FORWARD_DTYPE, sw), sw, dtype)
    dx = jnp.einsum("...o,io->...i", dequantize(gq, sg, dtype), qw,
                    preferred_element_type=dtype)
    gq, x, dx = jax.lax.optimization_barrier((gq, x, dx))
    qx = quantize(x, FORWARD_DTYPE, sx)
    dw = jnp.einsum("...i,...o->io", dequantize(qx, sx, dtype), dequantize(gq, sg, dtype),
                    preferred_element_type=dtype)
    # a call whose output never reaches the loss (a pipeline's off-schedule tick)
    # gets a zero cotangent and observes nothing
    seen = jnp.where(amax_dy > 0, jnp.stack([amax_x, amax_w, amax_dy]), 0.0)
    observed = jnp.zeros_like(history).at[:, 0].set(seen)
    return dx.astype(dtype), dw.astype(kernel.dtype), observed


fp8_dot.defvjp(_fp8_dot_fwd, _fp8_dot_bwd)


# A pipeline's tick loop reuses one stage's layers for every microbatch, and autodiff
# adds the cotangents of a reused value. Flax's ``fm32`` is float32 whose autodiff
# addition is a maximum: histories cast to it around that loop combine their
# observations correctly. The casts carry their own VJPs (JAX's transpose of a cast
# to an extended dtype fails).
@jax.custom_vjp
def _to_max(x: jax.Array) -> jax.Array:
    return jax.lax.convert_element_type(x, _fm32())


@jax.custom_vjp
def _from_max(x: jax.Array) -> jax.Array:
    return jax.lax.convert_element_type(x, jnp.float32)


def _fm32():
    from flax.linen.fp8_ops import fm32
    return fm32


_to_max.defvjp(lambda x: (_to_max(x), None),
               lambda _, g: (jax.lax.convert_element_type(g, jnp.float32),))
_from_max.defvjp(lambda x: (_from_max(x), None),
                 lambda _, g: (jax.lax.convert_element_type(g, _fm32()),))


def _map_meta(fn, tree):
    return jax.tree.map(lambda v: v.replace(fn(v[...])) if isinstance(v, Fp8Meta) else v,
                        tree, is_leaf=lambda x: isinstance(x, nnx.Variable))


def max_accumulating(tree):
    """The histories in ``tree`` as values whose reuse combines cotangents by maximum."""
    return _map_meta(_to_max, tree)


def plain_float(tree):
    """The inverse of :func:`max_accumulating`."""
    return _map_meta(_from_max, tree)
