"""The 4h GeLU MLP of GPT-NeoX and Bloom (Hugging Face parameter names)."""
from __future__ import annotations

import jax
from flax import nnx

from jaxsmp.nn.linear import Linear


class GeluMLP(nnx.Module):
    """``dense_4h_to_h(gelu(dense_h_to_4h(x)))``: column- then row-parallel over ``mlp``."""

    def __init__(self, hidden: int, intermediate: int, *, approximate: bool, init_std: float,
                 rngs: nnx.Rngs):
        self.approximate = approximate
        self.dense_h_to_4h = Linear(hidden, intermediate, in_axis="embed", out_axis="mlp",
                                    rngs=rngs, init_std=init_std)
        self.dense_4h_to_h = Linear(intermediate, hidden, in_axis="mlp", out_axis="embed",
                                    rngs=rngs, init_std=init_std)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = jax.nn.gelu(self.dense_h_to_4h(x), approximate=self.approximate)
        return self.dense_4h_to_h(h)
