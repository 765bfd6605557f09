"""Hugging Face ``config.json`` <-> jaxsmp model configs (GPT-NeoX, Bloom, Llama, Mixtral)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jaxsmp.models.bloom import BloomConfig
from jaxsmp.models.config_base import ModelConfig
from jaxsmp.models.gpt_neox import GPTNeoXConfig
from jaxsmp.models.llama import LlamaConfig
from jaxsmp.models.mixtral import MixtralConfig

ARCHITECTURES = {"gpt_neox": "GPTNeoXForCausalLM", "bloom": "BloomForCausalLM",
                 "llama": "LlamaForCausalLM", "mixtral": "MixtralForCausalLM"}
CONFIG_TYPES = {GPTNeoXConfig: "gpt_neox", BloomConfig: "bloom", LlamaConfig: "llama",
                MixtralConfig: "mixtral"}


def family_of(config: ModelConfig) -> str:
    """The model family ("gpt_neox", "bloom", "llama", "mixtral") of a jaxsmp config."""
    if type(config) not in CONFIG_TYPES:
        raise ValueError(f"no Hugging Face mapping for {type(config).__name__}; "
                         f"supported: {[t.__name__ for t in CONFIG_TYPES]}")
    return CONFIG_TYPES[type(config)]


class _Fields(dict):
    """A parsed ``config.json`` whose missing required field is a ValueError naming it."""

    def __missing__(self, key: str):
        raise ValueError(f"{self.get('model_type')} config is missing the required field "
                         f"{key!r}")

    def first(self, *keys: str):
        """The value of the first of ``keys`` present (HF names differ across versions)."""
        for key in keys:
            if key in self:
                return self[key]
        raise ValueError(f"{self.get('model_type')} config is missing the required field "
                         f"{' / '.join(map(repr, keys))}")


def _require(hf: dict, key: str, allowed: tuple, family: str) -> None:
    if key in hf and hf[key] not in allowed:
        raise ValueError(f"{family} checkpoint has {key}={hf[key]!r}; jaxsmp supports "
                         f"only {allowed}")


def _rope(hf: dict, family: str) -> dict:
    """``rope_parameters`` (transformers >= 5) or the legacy top-level keys."""
    rope = dict(hf.get("rope_parameters") or {})
    scaling = hf.get("rope_scaling") or {}
    kind = rope.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    if kind != "default":
        raise ValueError(f"{family} checkpoint uses rope_type={kind!r}; jaxsmp supports "
                         f"only the default rotary embedding")
    return rope


def _gpt_neox(hf: dict) -> GPTNeoXConfig:
    _require(hf, "hidden_act", ("gelu",), "gpt_neox")
    _require(hf, "attention_bias", (True,), "gpt_neox")
    _require(hf, "tie_word_embeddings", (False,), "gpt_neox")
    rope = _rope(hf, "gpt_neox")
    return GPTNeoXConfig(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        num_hidden_layers=hf["num_hidden_layers"],
        num_attention_heads=hf["num_attention_heads"],
        intermediate_size=hf["intermediate_size"],
        max_position_embeddings=hf.get("max_position_embeddings", 2048),
        rotary_pct=rope.get("partial_rotary_factor", hf.get("rotary_pct", 0.25)),
        rotary_emb_base=rope.get("rope_theta", hf.get("rotary_emb_base", 10000.0)),
        layer_norm_eps=hf.get("layer_norm_eps", 1e-5),
        use_parallel_residual=hf.get("use_parallel_residual", True))


def _bloom(hf: dict) -> BloomConfig:
    _require(hf, "tie_word_embeddings", (True,), "bloom")
    return BloomConfig(
        vocab_size=hf["vocab_size"], hidden_size=hf.first("hidden_size", "n_embed"),
        n_layer=hf.first("n_layer", "num_hidden_layers"),
        n_head=hf.first("n_head", "num_attention_heads"),
        layer_norm_epsilon=hf.get("layer_norm_epsilon", 1e-5),
        apply_residual_connection_post_layernorm=hf.get(
            "apply_residual_connection_post_layernorm", False))


def _llama(hf: dict) -> LlamaConfig:
    _require(hf, "hidden_act", ("silu",), "llama")
    rope = _rope(hf, "llama")
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("llama checkpoint uses partial rotary; jaxsmp's Llama rotates "
                         "whole heads")
    cfg = LlamaConfig(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        num_hidden_layers=hf["num_hidden_layers"],
        num_attention_heads=hf["num_attention_heads"],
        intermediate_size=hf["intermediate_size"],
        num_key_value_heads=hf.get("num_key_value_heads"),
        max_position_embeddings=hf.get("max_position_embeddings", 4096),
        rms_norm_eps=hf.get("rms_norm_eps", 1e-5),
        rope_theta=rope.get("rope_theta", hf.get("rope_theta", 10000.0)),
        attention_bias=hf.get("attention_bias", False), mlp_bias=hf.get("mlp_bias", False),
        tie_word_embeddings=hf.get("tie_word_embeddings", False))
    if hf.get("head_dim") not in (None, cfg.head_dim):
        raise ValueError(f"llama checkpoint has head_dim={hf['head_dim']}, but jaxsmp "
                         f"needs hidden_size / num_attention_heads = {cfg.head_dim}")
    return cfg


def _mixtral(hf: dict) -> MixtralConfig:
    """``output_router_logits`` and ``router_jitter_noise`` are HF runtime switches:
    jaxsmp's trainer always adds the weighted router losses and has no jitter."""
    _require(hf, "hidden_act", ("silu",), "mixtral")
    _require(hf, "sliding_window", (None,), "mixtral")
    _require(hf, "router_jitter_noise", (0, 0.0), "mixtral")
    rope = _rope(hf, "mixtral")
    cfg = MixtralConfig(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        num_hidden_layers=hf["num_hidden_layers"],
        num_attention_heads=hf["num_attention_heads"],
        intermediate_size=hf["intermediate_size"],
        num_key_value_heads=hf.get("num_key_value_heads"),
        num_local_experts=hf["num_local_experts"],
        num_experts_per_tok=hf["num_experts_per_tok"],
        router_aux_loss_coef=hf.get("router_aux_loss_coef", 0.001),
        max_position_embeddings=hf.get("max_position_embeddings", 4096 * 32),
        rms_norm_eps=hf.get("rms_norm_eps", 1e-5),
        rope_theta=rope.get("rope_theta", hf.get("rope_theta", 1e6)),
        tie_word_embeddings=hf.get("tie_word_embeddings", False))
    if hf.get("head_dim") not in (None, cfg.head_dim):
        raise ValueError(f"mixtral checkpoint has head_dim={hf['head_dim']}, but jaxsmp "
                         f"needs hidden_size / num_attention_heads = {cfg.head_dim}")
    return cfg


_FROM_HF = {"gpt_neox": _gpt_neox, "bloom": _bloom, "llama": _llama, "mixtral": _mixtral}


def from_hf_config(hf: dict[str, Any]) -> tuple[str, ModelConfig]:
    """(family, jaxsmp config) for a parsed HF ``config.json``; a missing required
    field is a ValueError naming it."""
    hf = _Fields(hf)
    family = hf.get("model_type")
    if family not in _FROM_HF:
        archs = hf.get("architectures")
        raise ValueError(f"unsupported Hugging Face architecture model_type={family!r} "
                         f"architectures={archs}; jaxsmp imports {sorted(_FROM_HF)}")
    return family, _FROM_HF[family](hf)


def load_config(path: str | Path) -> tuple[str, ModelConfig]:
    """(family, jaxsmp config) of the HF checkpoint directory ``path``."""
    file = Path(path) / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"{file} not found: not a Hugging Face checkpoint directory")
    try:
        return from_hf_config(json.loads(file.read_text()))
    except ValueError as e:
        raise ValueError(f"{file}: {e}") from None


def _rope_dict(theta: float, **extra) -> dict:
    return {"rope_theta": theta, "rope_type": "default", **extra}


def to_hf_config(config: ModelConfig, dtype: str = "float32") -> dict[str, Any]:
    """An HF ``config.json`` dict for ``config`` (new and legacy rope keys both written)."""
    family = family_of(config)
    common = {"architectures": [ARCHITECTURES[family]], "model_type": family,
              "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
              "initializer_range": config.init_std, "dtype": dtype, "use_cache": True}
    if family == "gpt_neox":
        return {**common, "num_hidden_layers": config.num_hidden_layers,
                "num_attention_heads": config.num_attention_heads,
                "intermediate_size": config.intermediate_size, "hidden_act": "gelu",
                "max_position_embeddings": config.max_position_embeddings,
                "layer_norm_eps": config.layer_norm_eps, "attention_bias": True,
                "use_parallel_residual": config.use_parallel_residual,
                "tie_word_embeddings": False,
                "rope_parameters": _rope_dict(config.rotary_emb_base,
                                              partial_rotary_factor=config.rotary_pct),
                "rotary_pct": config.rotary_pct, "rotary_emb_base": config.rotary_emb_base}
    if family == "bloom":
        return {**common, "n_layer": config.n_layer, "n_head": config.n_head,
                "layer_norm_epsilon": config.layer_norm_epsilon,
                "apply_residual_connection_post_layernorm":
                    config.apply_residual_connection_post_layernorm,
                "tie_word_embeddings": True}
    if family == "mixtral":
        for field, plain in (("capacity_factor", None), ("attention_bias", False)):
            if getattr(config, field) != plain:
                raise ValueError(f"mixtral {field}={getattr(config, field)!r} has no "
                                 f"Hugging Face equivalent; export needs {field}={plain}")
        return {**common, "num_hidden_layers": config.num_hidden_layers,
                "num_attention_heads": config.num_attention_heads,
                "num_key_value_heads": config.kv_heads, "head_dim": config.head_dim,
                "intermediate_size": config.intermediate_size, "hidden_act": "silu",
                "num_local_experts": config.num_local_experts,
                "num_experts_per_tok": config.num_experts_per_tok,
                "router_aux_loss_coef": config.router_aux_loss_coef,
                "output_router_logits": False, "router_jitter_noise": 0.0,
                "sliding_window": None,
                "max_position_embeddings": config.max_position_embeddings,
                "rms_norm_eps": config.rms_norm_eps,
                "tie_word_embeddings": config.tie_word_embeddings,
                "rope_parameters": _rope_dict(config.rope_theta),
                "rope_theta": config.rope_theta}
    return {**common, "num_hidden_layers": config.num_hidden_layers,
            "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.kv_heads, "head_dim": config.head_dim,
            "intermediate_size": config.intermediate_size, "hidden_act": "silu",
            "max_position_embeddings": config.max_position_embeddings,
            "rms_norm_eps": config.rms_norm_eps, "attention_bias": config.attention_bias,
            "mlp_bias": config.mlp_bias, "tie_word_embeddings": config.tie_word_embeddings,
            "rope_parameters": _rope_dict(config.rope_theta), "rope_theta": config.rope_theta}
