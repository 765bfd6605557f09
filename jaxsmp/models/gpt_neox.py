"""GPT-NeoX (EleutherAI): partial rotary, parallel residual, LayerNorm, GeLU, untied embeddings."""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from jaxsmp.models.config_base import ModelConfig
from jaxsmp.nn import Embed, LayerNorm, Linear, Stack, apply_rotary, rotary_for_tokens
from jaxsmp.nn.embed import check_token_ids
from jaxsmp.nn.fused_qkv import FusedQKVAttention
from jaxsmp.nn.gelu_mlp import GeluMLP


@dataclass(frozen=True)
class GPTNeoXConfig(ModelConfig):
    """Architecture hyper-parameters; field names follow Hugging Face's GPTNeoXConfig."""
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 2048
    rotary_pct: float = 0.25
    rotary_emb_base: float = 10000.0
    layer_norm_eps: float = 1e-5
    use_parallel_residual: bool = True
    attention_impl: str = "auto"
    init_std: float = 0.02

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by "
                             f"num_attention_heads {self.num_attention_heads}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.rotary_pct)


class Attention(FusedQKVAttention):
    """Fused QKV, rotary on ``rotary_pct`` of each head, causal attention."""

    def __init__(self, cfg: GPTNeoXConfig, *, rngs: nnx.Rngs):
        super().__init__(cfg.hidden_size, cfg.num_attention_heads,
                         attention_impl=cfg.attention_impl, init_std=cfg.init_std, rngs=rngs)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
        q, k, v = self.qkv(x)
        return self.attend(apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v)


class Layer(nnx.Module):
    def __init__(self, cfg: GPTNeoXConfig, *, rngs: nnx.Rngs):
        self.parallel = cfg.use_parallel_residual
        self.input_layernorm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, rngs=rngs)
        self.post_attention_layernorm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps,
                                                  rngs=rngs)
        self.attention = Attention(cfg, rngs=rngs)
        self.mlp = GeluMLP(cfg.hidden_size, cfg.intermediate_size, approximate=False,
                           init_std=cfg.init_std, rngs=rngs)

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
        attn = self.attention(self.input_layernorm(x), cos, sin)
        if self.parallel:
            return x + attn + self.mlp(self.post_attention_layernorm(x))
        x = x + attn
        return x + self.mlp(self.post_attention_layernorm(x))


class GPTNeoX(nnx.Module):
    """Token ids ``[batch, seq]`` -> float32 logits ``[batch, seq, vocab]``
    (:meth:`logits`: in the compute dtype, as the loss takes them)."""

    def __init__(self, cfg: GPTNeoXConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed_in = Embed(cfg.vocab_size, cfg.hidden_size, rngs=rngs, init_std=cfg.init_std)
        self.layers = Stack(lambda r: Layer(cfg, rngs=r), cfg.num_hidden_layers, rngs=rngs)
        self.final_layer_norm = LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps, rngs=rngs)
        self.embed_out = Linear(cfg.hidden_size, cfg.vocab_size, in_axis="embed",
                                out_axis="vocab", use_bias=False, rngs=rngs,
                                init_std=cfg.init_std)

    def logits(self, tokens: jax.Array) -> jax.Array:
        check_token_ids(tokens)
        cfg = self.cfg
        cos, sin = rotary_for_tokens(tokens, cfg.rotary_dim, cfg.rotary_emb_base,
                                     cfg.max_position_embeddings)
        x = self.embed_in(tokens)
        x = self.layers(x, cos, sin)
        return self.embed_out(self.final_layer_norm(x))

    def __call__(self, tokens: jax.Array) -> jax.Array:
        return self.logits(tokens).astype(jnp.float32)


GPTNeoXConfig.model_class = GPTNeoX


def _neox(vocab: int, d: int, layers: int, heads: int, **kw) -> GPTNeoXConfig:
    return GPTNeoXConfig(vocab_size=vocab, hidden_size=d, num_hidden_layers=layers,
                         num_attention_heads=heads, intermediate_size=4 * d, **kw)


# Published totals (Pythia paper, GPT-NeoX-20B paper) where a model of that shape exists.
PRESETS: dict[str, GPTNeoXConfig] = {
    "tiny": _neox(256, 128, 4, 4, max_position_embeddings=512),
    "125m": _neox(50304, 768, 12, 12),      # GPT-3 125M shape, untied = Pythia-160M
    "1.3b": _neox(50304, 2048, 24, 16),     # = Pythia-1.4B
    "2.7b": _neox(50304, 2560, 32, 32),     # = Pythia-2.8B
    "6.9b": _neox(50432, 4096, 32, 32),     # = Pythia-6.9B
    "12b": _neox(50688, 5120, 36, 40),      # = Pythia-12B
    "13b": _neox(50432, 5120, 40, 40),      # GPT-3 13B shape (SMP's GPT-NeoX-13B)
    "20b": _neox(50432, 6144, 44, 64, rotary_emb_base=10000.0),  # = GPT-NeoX-20B
    "100b": _neox(50432, 10240, 80, 80),    # same architecture, ~101.7B
}

PUBLISHED_PARAMS: dict[str, int] = {
    "125m": 162_322_944,
    "1.3b": 1_414_647_808,
    "2.7b": 2_775_208_960,
    "6.9b": 6_857_302_016,
    "12b": 11_846_072_320,
    "20b": 20_554_567_680,
}
