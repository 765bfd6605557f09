"""Llama 2 (Meta): RMSNorm, SwiGLU, rotary, grouped-query attention, untied embeddings."""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from jaxsmp.models.config_base import ModelConfig
from jaxsmp.nn import Embed, Linear, RMSNorm, Stack, apply_rotary, rotary_for_tokens
from jaxsmp.nn.attention import attention
from jaxsmp.nn.embed import check_token_ids
from jaxsmp.nn.remat import name_qkv


@dataclass(frozen=True)
class LlamaConfig(ModelConfig):
    """Architecture hyper-parameters; field names follow Hugging Face's LlamaConfig.
    ``num_key_value_heads`` < ``num_attention_heads`` is grouped-query attention
    (``None``: as many as the query heads)."""
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    num_key_value_heads: int | None = None
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    attention_bias: bool = False
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    attention_impl: str = "auto"
    init_std: float = 0.02

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:  # canonical form: always explicit
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by "
                             f"num_attention_heads {self.num_attention_heads}")
        if self.num_attention_heads % self.kv_heads:
            raise ValueError(f"num_key_value_heads {self.kv_heads} must divide "
                             f"num_attention_heads {self.num_attention_heads}")

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


class Attention(nnx.Module):
    """Separate q/k/v projections (k, v with ``kv_heads``), rotary on the whole head."""

    def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d, hd = cfg.hidden_size, cfg.head_dim
        kw = dict(rngs=rngs, use_bias=cfg.attention_bias, init_std=cfg.init_std)
        self.q_proj = Linear(d, cfg.num_attention_heads * hd, in_axis="embed",
                             out_axis="heads", **kw)
        self.k_proj = Linear(d, cfg.kv_heads * hd, in_axis="embed", out_axis="kv_heads", **kw)
        self.v_proj = Linear(d, cfg.kv_heads * hd, in_axis="embed", out_axis="kv_heads", **kw)
        self.o_proj = Linear(cfg.num_attention_heads * hd, d, in_axis="heads",
                             out_axis="embed", **kw)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
        b, s, _ = x.shape
        cfg = self.cfg
        q = name_qkv(self.q_proj(x)).reshape(b, s, cfg.num_attention_heads, cfg.head_dim)
        k = name_qkv(self.k_proj(x)).reshape(b, s, cfg.kv_heads, cfg.head_dim)
        v = name_qkv(self.v_proj(x)).reshape(b, s, cfg.kv_heads, cfg.head_dim)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = attention(q, k, v, causal=True, impl=cfg.attention_impl)
        return self.o_proj(out.reshape(b, s, cfg.num_attention_heads * cfg.head_dim))


class MLP(nnx.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
        d, f = cfg.hidden_size, cfg.intermediate_size
        kw = dict(rngs=rngs, use_bias=cfg.mlp_bias, init_std=cfg.init_std)
        self.gate_proj = Linear(d, f, in_axis="embed", out_axis="mlp", **kw)
        self.up_proj = Linear(d, f, in_axis="embed", out_axis="mlp", **kw)
        self.down_proj = Linear(f, d, in_axis="mlp", out_axis="embed", **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nnx.Module):
    def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, rngs=rngs)
        self.self_attn = Attention(cfg, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps,
                                                rngs=rngs)
        self.mlp = MLP(cfg, rngs=rngs)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nnx.Module):
    """Token ids ``[batch, seq]`` -> float32 logits ``[batch, seq, vocab]``
    (:meth:`logits`: in the compute dtype, as the loss takes them)."""

    def __init__(self, cfg: LlamaConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed_tokens = Embed(cfg.vocab_size, cfg.hidden_size, rngs=rngs,
                                  init_std=cfg.init_std)
        self.layers = Stack(lambda r: Layer(cfg, rngs=r), cfg.num_hidden_layers, rngs=rngs)
        self.norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, rngs=rngs)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(
            cfg.hidden_size, cfg.vocab_size, in_axis="embed", out_axis="vocab",
            use_bias=False, rngs=rngs, init_std=cfg.init_std)

    def logits(self, tokens: jax.Array) -> jax.Array:
        check_token_ids(tokens)
        cfg = self.cfg
        cos, sin = rotary_for_tokens(tokens, cfg.head_dim, cfg.rope_theta,
                                     cfg.max_position_embeddings)
        x = self.layers(self.embed_tokens(tokens), cos, sin)
        x = self.norm(x)
        return self.embed_tokens.attend(x) if self.lm_head is None else self.lm_head(x)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        return self.logits(tokens).astype(jnp.float32)


LlamaConfig.model_class = Llama


def _llama(vocab: int, d: int, layers: int, heads: int, ffn: int, **kw) -> LlamaConfig:
    return LlamaConfig(vocab_size=vocab, hidden_size=d, num_hidden_layers=layers,
                       num_attention_heads=heads, intermediate_size=ffn, **kw)


PRESETS: dict[str, LlamaConfig] = {
    "tiny": _llama(256, 128, 4, 4, 352, num_key_value_heads=2, max_position_embeddings=512),
    "7b": _llama(32000, 4096, 32, 32, 11008),                            # Llama-2-7b
    "13b": _llama(32000, 5120, 40, 40, 13824),                           # Llama-2-13b
    "70b": _llama(32000, 8192, 80, 64, 28672, num_key_value_heads=8),    # Llama-2-70b
}

# Totals of the published checkpoints (sum of their tensors' sizes).
PUBLISHED_PARAMS: dict[str, int] = {
    "7b": 6_738_415_616,
    "13b": 13_015_864_320,
    "70b": 68_976_648_192,
}
