"""Self-attention with one fused QKV projection laid out ``[heads, 3, head_dim]``
(GPT-NeoX and Bloom, as in their Hugging Face checkpoints)."""
from __future__ import annotations

import jax
from flax import nnx

from jaxsmp.nn.attention import attention
from jaxsmp.nn.linear import Linear
from jaxsmp.nn.remat import name_qkv


class FusedQKVAttention(nnx.Module):
    """``query_key_value`` is column-parallel over heads, ``dense`` row-parallel.
    Subclasses add position information (rotary, ALiBi) between the two."""

    def __init__(self, hidden: int, heads: int, *, attention_impl: str, init_std: float,
                 rngs: nnx.Rngs):
        self.heads, self.head_dim, self.impl = heads, hidden // heads, attention_impl
        self.query_key_value = Linear(hidden, 3 * hidden, in_axis="embed", out_axis="heads",
                                      rngs=rngs, init_std=init_std)
        self.dense = Linear(hidden, hidden, in_axis="heads", out_axis="embed", rngs=rngs,
                            init_std=init_std)

    def qkv(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """q, k, v of shape ``[batch, seq, heads, head_dim]``."""
        b, s, _ = x.shape
        qkv = name_qkv(self.query_key_value(x)).reshape(b, s, self.heads, 3, self.head_dim)
        return qkv[:, :, :, 0], qkv[:, :, :, 1], qkv[:, :, :, 2]

    def attend(self, q: jax.Array, k: jax.Array, v: jax.Array,
               alibi_slopes: jax.Array | None = None) -> jax.Array:
        """Causal attention (:func:`jaxsmp.nn.attention.attention`), then ``dense``."""
        b, s = q.shape[:2]
        out = attention(q, k, v, causal=True, alibi_slopes=alibi_slopes, impl=self.impl)
        return self.dense(out.reshape(b, s, self.heads * self.head_dim))
