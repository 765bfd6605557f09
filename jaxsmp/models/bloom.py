"""Bloom (BigScience): ALiBi, LayerNorm after the embedding, fused QKV, tanh GeLU, tied
embeddings."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

import pallas_kernels
from jaxsmp.models.config_base import ModelConfig
from jaxsmp.nn import Embed, LayerNorm, Stack
from jaxsmp.nn.embed import check_token_ids
from jaxsmp.nn.fused_qkv import FusedQKVAttention
from jaxsmp.nn.gelu_mlp import GeluMLP


@dataclass(frozen=True)
class BloomConfig(ModelConfig):
    """Architecture hyper-parameters; field names follow Hugging Face's BloomConfig
    (``n_layer``, ``n_head``; the MLP is always 4 x hidden)."""
    vocab_size: int
    hidden_size: int
    n_layer: int
    n_head: int
    layer_norm_epsilon: float = 1e-5
    apply_residual_connection_post_layernorm: bool = False
    attention_impl: str = "auto"
    init_std: float = 0.02
    # The output head is the word embedding (FLOPs count it as a matmul).
    tie_word_embeddings: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.hidden_size % self.n_head:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by "
                             f"n_head {self.n_head}")

    @property
    def num_hidden_layers(self) -> int:
        return self.n_layer

    @property
    def num_attention_heads(self) -> int:
        return self.n_head

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.n_head

    @property
    def intermediate_size(self) -> int:
        return 4 * self.hidden_size


class Attention(FusedQKVAttention):
    """Fused QKV, ALiBi biases from per-head slopes, causal attention."""

    def __init__(self, cfg: BloomConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg.hidden_size, cfg.n_head, attention_impl=cfg.attention_impl,
                         init_std=cfg.init_std, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        q, k, v = self.qkv(x)
        slopes = jnp.asarray(pallas_kernels.alibi_slopes(self.heads))
        return self.attend(q, k, v, alibi_slopes=slopes)


class Layer(nnx.Module):
    def __init__(self, cfg: BloomConfig, *, rngs: nnx.Rngs):
        self.post_ln_residual = cfg.apply_residual_connection_post_layernorm
        eps = cfg.layer_norm_epsilon
        self.input_layernorm = LayerNorm(cfg.hidden_size, eps=eps, rngs=rngs)
        self.self_attention = Attention(cfg, rngs=rngs)
        self.post_attention_layernorm = LayerNorm(cfg.hidden_size, eps=eps, rngs=rngs)
        self.mlp = GeluMLP(cfg.hidden_size, cfg.intermediate_size, approximate=True,
                           init_std=cfg.init_std, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = self.input_layernorm(x)
        x = (h if self.post_ln_residual else x) + self.self_attention(h)
        h = self.post_attention_layernorm(x)
        return (h if self.post_ln_residual else x) + self.mlp(h)


class Bloom(nnx.Module):
    """Token ids ``[batch, seq]`` -> float32 logits ``[batch, seq, vocab]``
    (:meth:`logits`: in the compute dtype, as the loss takes them)."""

    def __init__(self, cfg: BloomConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        eps = cfg.layer_norm_epsilon
        self.word_embeddings = Embed(cfg.vocab_size, cfg.hidden_size, rngs=rngs,
                                     init_std=cfg.init_std)
        self.word_embeddings_layernorm = LayerNorm(cfg.hidden_size, eps=eps, rngs=rngs)
        self.h = Stack(lambda r: Layer(cfg, rngs=r), cfg.n_layer, rngs=rngs)
        self.ln_f = LayerNorm(cfg.hidden_size, eps=eps, rngs=rngs)

    def logits(self, tokens: jax.Array) -> jax.Array:
        check_token_ids(tokens)
        x = self.word_embeddings_layernorm(self.word_embeddings(tokens))
        x = self.h(x)
        return self.word_embeddings.attend(self.ln_f(x))

    def __call__(self, tokens: jax.Array) -> jax.Array:
        return self.logits(tokens).astype(jnp.float32)


BloomConfig.model_class = Bloom


def _bloom(vocab: int, d: int, layers: int, heads: int, **kw) -> BloomConfig:
    return BloomConfig(vocab_size=vocab, hidden_size=d, n_layer=layers, n_head=heads, **kw)


PRESETS: dict[str, BloomConfig] = {
    "tiny": _bloom(256, 128, 4, 4),
    "560m": _bloom(250880, 1024, 24, 16),     # bigscience/bloom-560m
    "1b7": _bloom(250880, 2048, 24, 16),      # bigscience/bloom-1b7
    "7b1": _bloom(250880, 4096, 30, 32),      # bigscience/bloom-7b1
    "50b": _bloom(250880, 8192, 60, 64),      # same architecture, ~50.4B
    "176b": _bloom(250880, 14336, 70, 112),   # bigscience/bloom
}

# Totals of the published checkpoints (sum of their tensors' sizes).
PUBLISHED_PARAMS: dict[str, int] = {
    "560m": 559_214_592,
    "1b7": 1_722_408_960,
    "7b1": 7_069_016_064,
    "176b": 176_247_271_424,
}
