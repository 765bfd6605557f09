"""The attention entry point: dispatches to an implementation by name."""
from __future__ import annotations

import jax

from pallas_kernels.reference import attention_reference

IMPLS = ("reference",)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool,
              alibi_slopes: jax.Array | None = None, segment_ids: jax.Array | None = None,
              softmax_scale: float | None = None, impl: str = "reference") -> jax.Array:
    """Attention on [batch, seq, heads, head_dim] inputs; k/v may have fewer heads (GQA)."""
    if q.shape[2] % k.shape[2]:
        raise ValueError(f"kv heads {k.shape[2]} must divide query heads {q.shape[2]}")
    if impl == "reference":
        return attention_reference(q, k, v, causal=causal, alibi_slopes=alibi_slopes,
                                   segment_ids=segment_ids, softmax_scale=softmax_scale)
    raise ValueError(f"unknown attention impl {impl!r}; valid: {IMPLS}")
