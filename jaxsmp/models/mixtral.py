"""Mixtral (Mistral AI): Llama's attention with a sparse mixture of SwiGLU experts
(:class:`jaxsmp.nn.moe.MoE`) in place of the MLP."""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from jaxsmp.models.config_base import ModelConfig
from jaxsmp.models.llama import Attention
from jaxsmp.nn import Embed, Linear, RMSNorm, Stack, rotary_for_tokens
from jaxsmp.nn.embed import check_token_ids
from jaxsmp.nn.moe import MoE, router_losses, router_stats


@dataclass(frozen=True)
class MixtralConfig(ModelConfig):
    """Field names follow Hugging Face's MixtralConfig. ``router_aux_loss_coef`` weighs
    the load-balancing loss and ``router_z_loss_coef`` the router z-loss in
    :func:`jaxsmp.losses.causal_lm_loss`; ``capacity_factor`` None is dropless."""
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    num_key_value_heads: int | None = None
    num_local_experts: int = 8
    num_experts_per_tok: int = 2
    router_aux_loss_coef: float = 0.001
    router_z_loss_coef: float = 0.0
    capacity_factor: float | None = None
    max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-5
    rope_theta: float = 1e6
    tie_word_embeddings: bool = False
    attention_bias: bool = False   # the attention shared with Llama reads it
    attention_impl: str = "auto"
    init_std: float = 0.02

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by "
                             f"num_attention_heads {self.num_attention_heads}")
        if self.num_attention_heads % self.kv_heads:
            raise ValueError(f"num_key_value_heads {self.kv_heads} must divide "
                             f"num_attention_heads {self.num_attention_heads}")
        if not 1 <= self.num_experts_per_tok <= self.num_local_experts:
            raise ValueError(f"num_experts_per_tok {self.num_experts_per_tok} must be in "
                             f"1..{self.num_local_experts} (num_local_experts)")
        if self.capacity_factor is not None and not self.capacity_factor > 0:
            raise ValueError(f"capacity_factor must be > 0 or None (dropless), got "
                             f"{self.capacity_factor}")

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def inactive_expert_params(self) -> int:
        """Expert parameters a token does not use (its ``num_local_experts -
        num_experts_per_tok`` unchosen experts' SwiGLUs in every layer)."""
        unused = self.num_local_experts - self.num_experts_per_tok
        return unused * 3 * self.hidden_size * self.intermediate_size * self.num_hidden_layers


class Layer(nnx.Module):
    def __init__(self, cfg: MixtralConfig, *, rngs: nnx.Rngs):
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, rngs=rngs)
        self.self_attn = Attention(cfg, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps,
                                                rngs=rngs)
        self.block_sparse_moe = MoE(cfg.hidden_size, cfg.intermediate_size,
                                    cfg.num_local_experts, cfg.num_experts_per_tok,
                                    rngs=rngs, init_std=cfg.init_std,
                                    capacity_factor=cfg.capacity_factor)

    def __call__(self, carry, cos: jax.Array, sin: jax.Array):
        x, stats = carry
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        y, stats = self.block_sparse_moe(self.post_attention_layernorm(x), stats)
        return x + y, stats


class Mixtral(nnx.Module):
    """Token ids ``[batch, seq]`` -> float32 logits ``[batch, seq, vocab]`` (:meth:`logits`:
    in the compute dtype, as the loss takes them); :meth:`with_router_losses` adds the
    router's losses and statistics."""

    def __init__(self, cfg: MixtralConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed_tokens = Embed(cfg.vocab_size, cfg.hidden_size, rngs=rngs,
                                  init_std=cfg.init_std)
        self.layers = Stack(lambda r: Layer(cfg, rngs=r), cfg.num_hidden_layers, rngs=rngs)
        self.norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps, rngs=rngs)
        self.lm_head = None if cfg.tie_word_embeddings else Linear(
            cfg.hidden_size, cfg.vocab_size, in_axis="embed", out_axis="vocab",
            use_bias=False, rngs=rngs, init_std=cfg.init_std)

    def with_router_losses(self, tokens: jax.Array) -> tuple[jax.Array, dict]:
        """(logits in the compute dtype, {"aux_loss", "z_loss", "dropped_tokens",
        "expert_load"}):
        ``expert_load[l, e]``: the fraction of layer ``l``'s token-to-expert assignments
        that went to expert ``e`` (each row sums to 1; balanced: ``1 / experts``)."""
        check_token_ids(tokens)
        cfg = self.cfg
        cos, sin = rotary_for_tokens(tokens, cfg.head_dim, cfg.rope_theta,
                                     cfg.max_position_embeddings)
        x = self.embed_tokens(tokens)
        stats = router_stats(cfg.num_hidden_layers, cfg.num_local_experts, x)
        x, stats = self.layers((x, stats), cos, sin)
        x = self.norm(x)
        logits = self.embed_tokens.attend(x) if self.lm_head is None else self.lm_head(x)
        return logits, router_losses(stats, tokens.size, cfg.num_experts_per_tok)

    def logits(self, tokens: jax.Array) -> jax.Array:
        return self.with_router_losses(tokens)[0]

    def __call__(self, tokens: jax.Array) -> jax.Array:
        return self.logits(tokens).astype(jnp.float32)


MixtralConfig.model_class = Mixtral


def _mixtral(vocab: int, d: int, layers: int, heads: int, ffn: int, **kw) -> MixtralConfig:
    return MixtralConfig(vocab_size=vocab, hidden_size=d, num_hidden_layers=layers,
                         num_attention_heads=heads, intermediate_size=ffn, **kw)


PRESETS: dict[str, MixtralConfig] = {
    "tiny": _mixtral(256, 128, 4, 4, 256, num_key_value_heads=2, num_local_experts=4,
                     max_position_embeddings=512, router_aux_loss_coef=0.02),
    # Mixtral-8x7B-v0.1 and Mixtral-8x22B-v0.1 (their config.json)
    "8x7b": _mixtral(32000, 4096, 32, 32, 14336, num_key_value_heads=8,
                     max_position_embeddings=32768, router_aux_loss_coef=0.02),
    "8x22b": _mixtral(32000, 6144, 56, 48, 16384, num_key_value_heads=8,
                      max_position_embeddings=65536, router_aux_loss_coef=0.001),
}

# Totals of the published checkpoints (sum of their tensors' sizes).
PUBLISHED_PARAMS: dict[str, int] = {
    "8x7b": 46_702_792_704,
    "8x22b": 140_620_634_112,
}
