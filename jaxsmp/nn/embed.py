"""Token embedding, vocabulary-parallel over ``tp``."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxsmp.nn.layer_context import current_layer_context
from jaxsmp.nn.param import logical_param


def check_token_ids(tokens: jax.Array) -> None:
    """Models take integer token ids ``[batch, seq]``; anything else is a clear error."""
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(f"tokens must be integer ids of shape [batch, seq], got "
                         f"{tokens.dtype}{list(tokens.shape)}")


class Embed(nnx.Module):
    """Looks up ``[vocab, embed]`` rows; ``attend`` gives tied output logits."""

    def __init__(self, vocab: int, dim: int, *, rngs: nnx.Rngs, init_std: float = 0.02):
        self.embedding = logical_param(rngs, nnx.initializers.normal(init_std),
                                       (vocab, dim), ("vocab", "embed"))

    def __call__(self, tokens: jax.Array) -> jax.Array:
        rows = current_layer_context().embed_lookup(self.embedding, tokens)
        return jnp.take(self.embedding[...], tokens, axis=0) if rows is None else rows

    def attend(self, x: jax.Array) -> jax.Array:
        table = self.embedding[...]
        return jnp.einsum("...d,vd->...v", x.astype(table.dtype), table)
