"""Plain softmax attention: the reference every kernel is tested against."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def attention_reference(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool,
                        alibi_slopes: jax.Array | None = None,
                        segment_ids: jax.Array | None = None,
                        softmax_scale: float | None = None) -> jax.Array:
    """Materialises the [b, h, s, s] scores. q: [b, s, h, d]; k, v: [b, s, kv_h, d]."""
    b, s, h, d = q.shape
    kv_h = k.shape[2]
    scale = d ** -0.5 if softmax_scale is None else softmax_scale
    groups = h // kv_h
    k = jnp.repeat(k, groups, axis=2)
    v = jnp.repeat(v, groups, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) * scale
    qpos = jnp.arange(s)[:, None]
    kpos = jnp.arange(k.shape[1])[None, :]
    if alibi_slopes is not None:
        scores = scores + alibi_slopes.astype(jnp.float32)[None, :, None, None] * (kpos - qpos)
    mask = jnp.ones((s, k.shape[1]), bool)
    if causal:
        mask = qpos >= kpos
    mask = jnp.broadcast_to(mask, (b, 1, s, k.shape[1]))
    if segment_ids is not None:
        mask = mask & (segment_ids[:, None, :, None] == segment_ids[:, None, None, :])
    scores = jnp.where(mask, scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    probs = jnp.where(mask, probs, 0.0)
    out = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(v.dtype), v,
                     preferred_element_type=jnp.float32)
    return out.astype(q.dtype)
