"""The attention entry point: validates inputs and dispatches to an implementation by name."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.blockwise import blockwise_attention
from pallas_kernels.flash_attention import flash_attention
from pallas_kernels.reference import attention_reference

IMPLS = ("auto", "reference", "blockwise", "pallas")
DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
# Default (block_q, block_k), capped at the sequence length.
DEFAULT_BLOCKS = {"pallas": (64, 64), "blockwise": (512, 512)}
# Triton tiles must be powers of two and tl.dot needs every dimension >= 16.
PALLAS_HEAD_DIMS = (16, 32, 64, 128, 256)
PALLAS_MIN_BLOCK = 16


def resolve_impl(impl: str) -> str:
    """Maps "auto" to "pallas" on GPU and "blockwise" elsewhere; rejects unknown names."""
    if impl not in IMPLS:
        raise ValueError(f"unknown attention impl {impl!r}; valid: {IMPLS}")
    if impl == "auto":
        return "pallas" if jax.default_backend() == "gpu" else "blockwise"
    return impl


def _check_shapes(q: jax.Array, k: jax.Array, v: jax.Array, alibi_slopes: jax.Array | None,
                  segment_ids: jax.Array | None) -> None:
    if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape:
        raise ValueError(f"expected q [b, s, h, d] and k, v [b, s, kv_h, d] of equal shape; "
                         f"got q {q.shape}, k {k.shape}, v {v.shape}")
    b, s, h, d = q.shape
    if (k.shape[0], k.shape[1], k.shape[3]) != (b, s, d):
        raise ValueError(f"k/v batch, seq and head_dim must match q: q {q.shape}, k {k.shape}")
    if h % k.shape[2]:
        raise ValueError(f"kv heads {k.shape[2]} must divide query heads {h}")
    if alibi_slopes is not None and alibi_slopes.shape != (h,):
        raise ValueError(f"alibi_slopes must have shape ({h},), got {alibi_slopes.shape}")
    if segment_ids is not None and (segment_ids.shape != (b, s)
                                    or not jnp.issubdtype(segment_ids.dtype, jnp.integer)):
        raise ValueError(f"segment_ids must be integer [{b}, {s}], got "
                         f"{segment_ids.dtype}{list(segment_ids.shape)}")


def _check_kernel_inputs(impl: str, q: jax.Array, k: jax.Array, v: jax.Array,
                         block_q: int, block_k: int) -> None:
    if not all(x.dtype in DTYPES for x in (q, k, v)) or len({q.dtype, k.dtype, v.dtype}) > 1:
        raise ValueError(f"impl {impl!r} needs q, k, v of one dtype among float32, bfloat16, "
                         f"float16; got {q.dtype}, {k.dtype}, {v.dtype}")
    seq_len, head_dim = q.shape[1], q.shape[3]
    if impl == "pallas" and head_dim not in PALLAS_HEAD_DIMS:
        raise ValueError(f"impl 'pallas' supports head_dim in {PALLAS_HEAD_DIMS}, got {head_dim}")
    for name, block in (("block_q", block_q), ("block_k", block_k)):
        if block < 1 or seq_len % block:
            raise ValueError(f"{name}={block} must be positive and divide seq len {seq_len} "
                             f"(inputs are not padded)")
        if impl == "pallas" and (block < PALLAS_MIN_BLOCK or block & (block - 1)):
            raise ValueError(f"impl 'pallas' needs {name} a power of two >= "
                             f"{PALLAS_MIN_BLOCK}, got {block}")


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool,
              alibi_slopes: jax.Array | None = None, segment_ids: jax.Array | None = None,
              softmax_scale: float | None = None, impl: str = "auto",
              block_q: int | None = None, block_k: int | None = None,
              interpret: bool = False) -> jax.Array:
    """Softmax attention on q [b, s, h, d] and k, v [b, s, kv_h, d] (kv_h divides h).

    ALiBi adds ``slope[h] * (k_pos - q_pos)`` to the scaled scores; ``segment_ids`` [b, s]
    restricts attention to equal ids (packed sequences). ``impl``: "auto" (Pallas on GPU,
    blockwise XLA elsewhere), "reference", "blockwise" or "pallas". Block sizes default to
    (64, 64) for Pallas and (512, 512) for blockwise, capped at the sequence length.
    ``interpret`` runs Pallas kernels in the interpreter (CPU tests). ALiBi slopes are
    treated as constants by the blockwise and Pallas gradients.
    """
    impl = resolve_impl(impl)
    _check_shapes(q, k, v, alibi_slopes, segment_ids)
    scale = q.shape[3] ** -0.5 if softmax_scale is None else float(softmax_scale)
    if impl == "reference":
        if block_q is not None or block_k is not None:
            raise ValueError("impl 'reference' is unblocked; block_q/block_k must be None")
        return attention_reference(q, k, v, causal=causal, alibi_slopes=alibi_slopes,
                                   segment_ids=segment_ids, softmax_scale=scale)
    default_q, default_k = DEFAULT_BLOCKS[impl]
    seq_len = q.shape[1]
    block_q = min(default_q, seq_len) if block_q is None else block_q
    block_k = min(default_k, seq_len) if block_k is None else block_k
    _check_kernel_inputs(impl, q, k, v, block_q, block_k)
    if alibi_slopes is not None:
        alibi_slopes = jax.lax.stop_gradient(alibi_slopes.astype(jnp.float32))
    if segment_ids is not None:
        segment_ids = segment_ids.astype(jnp.int32)
    fn = flash_attention if impl == "pallas" else blockwise_attention
    return fn(q, k, v, alibi_slopes, segment_ids, scale, bool(causal), block_q, block_k,
              interpret)
