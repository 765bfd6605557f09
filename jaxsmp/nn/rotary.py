"""Rotary position embedding (GPT-NeoX / Llama "rotate half" form) on part of a head."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def rotary_tables(positions: jax.Array, rotary_dim: int,
                  base: float = 10000.0) -> tuple[jax.Array, jax.Array]:
    """cos and sin of shape ``[..., seq, rotary_dim]`` for integer ``positions``."""
    inv_freq = 1.0 / (base ** (jnp.arange(0, rotary_dim, 2, dtype=jnp.float32) / rotary_dim))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates the first ``cos.shape[-1]`` features of ``x`` ``[b, s, h, d]``."""
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot].astype(jnp.float32), x[..., rot:]
    half = rot // 2
    rotated = jnp.concatenate([-x_rot[..., half:], x_rot[..., :half]], axis=-1)
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    out = x_rot * cos + rotated * sin
    return jnp.concatenate([out.astype(x.dtype), x_pass], axis=-1)


def rotary_for_tokens(tokens: jax.Array, rotary_dim: int, base: float,
                      max_positions: int) -> tuple[jax.Array, jax.Array]:
    """cos and sin for positions ``0..seq-1`` of ``tokens`` ``[batch, seq]``, after
    checking that ``seq`` fits the model's ``max_positions``."""
    seq = tokens.shape[1]
    if seq > max_positions:
        raise ValueError(f"sequence length {seq} exceeds the model's maximum "
                         f"max_position_embeddings={max_positions}")
    return rotary_tables(jnp.broadcast_to(jnp.arange(seq), tokens.shape), rotary_dim, base)
