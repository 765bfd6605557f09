"""Which Hugging Face tensor holds each jaxsmp parameter, and how it is laid out.

HF ``nn.Linear`` weights are ``[out, in]``; jaxsmp kernels are ``[in, out]``
(``transpose``). Stacked layers have one HF tensor per layer (``{i}`` in the name)
and a leading ``layers`` axis here. Fused QKV layouts already agree (GPT-NeoX and
Bloom both interleave per head: ``[heads, 3, head_dim]``) and so do the rotary
conventions (HF rotates halves ``[x1, x2] -> [-x2, x1]``, as ``jaxsmp.nn.rotary``),
so no tensor is permuted.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from jaxsmp.hf.config import family_of
from jaxsmp.models.config_base import ModelConfig

Path = tuple[str, ...]


@dataclass(frozen=True)
class TensorMap:
    """jaxsmp parameter ``path`` <- HF tensor ``hf`` (``{i}``: one per stacked layer;
    ``{e}``: one per expert, the axis after the layers')."""
    path: Path
    hf: str
    transpose: bool = False

    @property
    def stacked(self) -> bool:
        return "{i}" in self.hf

    @property
    def keys(self) -> tuple[str, ...]:
        """The leading parameter axes with one HF tensor per index, in order."""
        return tuple(k for k in ("i", "e") if "{" + k + "}" in self.hf)

    def hf_name(self, *index: int) -> str:
        """The HF tensor of ``index`` (one int per :attr:`keys`)."""
        return self.hf.format(**dict(zip(self.keys, index)))

    def indices(self, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
        """Every index of the leading :attr:`keys` axes of a parameter of ``shape``, one
        HF tensor each, in order; ``[()]`` for a single tensor."""
        return list(itertools.product(*(range(n) for n in shape[:len(self.keys)])))

    def hf_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of each HF tensor of a parameter of ``shape``."""
        per_tensor = tuple(shape[len(self.keys):])
        return tuple(reversed(per_tensor)) if self.transpose else per_tensor


def _linear(path: Path, hf: str, bias: bool = True) -> list[TensorMap]:
    maps = [TensorMap(path + ("kernel",), hf + ".weight", transpose=True)]
    return maps + ([TensorMap(path + ("bias",), hf + ".bias")] if bias else [])


def _norm(path: Path, hf: str, bias: bool = True) -> list[TensorMap]:
    maps = [TensorMap(path + ("scale",), hf + ".weight")]
    return maps + ([TensorMap(path + ("bias",), hf + ".bias")] if bias else [])


def _gpt_neox(cfg) -> list[TensorMap]:
    layer, hf = ("layers", "layers"), "gpt_neox.layers.{i}"
    return [TensorMap(("embed_in", "embedding"), "gpt_neox.embed_in.weight"),
            *_norm(layer + ("input_layernorm",), hf + ".input_layernorm"),
            *_norm(layer + ("post_attention_layernorm",), hf + ".post_attention_layernorm"),
            *_linear(layer + ("attention", "query_key_value"), hf + ".attention.query_key_value"),
            *_linear(layer + ("attention", "dense"), hf + ".attention.dense"),
            *_linear(layer + ("mlp", "dense_h_to_4h"), hf + ".mlp.dense_h_to_4h"),
            *_linear(layer + ("mlp", "dense_4h_to_h"), hf + ".mlp.dense_4h_to_h"),
            *_norm(("final_layer_norm",), "gpt_neox.final_layer_norm"),
            TensorMap(("embed_out", "kernel"), "embed_out.weight", transpose=True)]


def _bloom(cfg) -> list[TensorMap]:
    layer, hf = ("h", "layers"), "transformer.h.{i}"
    return [TensorMap(("word_embeddings", "embedding"), "transformer.word_embeddings.weight"),
            *_norm(("word_embeddings_layernorm",), "transformer.word_embeddings_layernorm"),
            *_norm(layer + ("input_layernorm",), hf + ".input_layernorm"),
            *_linear(layer + ("self_attention", "query_key_value"),
                     hf + ".self_attention.query_key_value"),
            *_linear(layer + ("self_attention", "dense"), hf + ".self_attention.dense"),
            *_norm(layer + ("post_attention_layernorm",), hf + ".post_attention_layernorm"),
            *_linear(layer + ("mlp", "dense_h_to_4h"), hf + ".mlp.dense_h_to_4h"),
            *_linear(layer + ("mlp", "dense_4h_to_h"), hf + ".mlp.dense_4h_to_h"),
            *_norm(("ln_f",), "transformer.ln_f")]


def _llama(cfg) -> list[TensorMap]:
    layer, hf = ("layers", "layers"), "model.layers.{i}"
    attn, mlp = cfg.attention_bias, cfg.mlp_bias
    maps = [TensorMap(("embed_tokens", "embedding"), "model.embed_tokens.weight"),
            *_norm(layer + ("input_layernorm",), hf + ".input_layernorm", bias=False),
            *[m for p in ("q_proj", "k_proj", "v_proj", "o_proj")
              for m in _linear(layer + ("self_attn", p), f"{hf}.self_attn.{p}", attn)],
            *_norm(layer + ("post_attention_layernorm",), hf + ".post_attention_layernorm",
                   bias=False),
            *[m for p in ("gate_proj", "up_proj", "down_proj")
              for m in _linear(layer + ("mlp", p), f"{hf}.mlp.{p}", mlp)],
            *_norm(("norm",), "model.norm", bias=False)]
    if not cfg.tie_word_embeddings:
        maps.append(TensorMap(("lm_head", "kernel"), "lm_head.weight", transpose=True))
    return maps


def _mixtral(cfg) -> list[TensorMap]:
    """The layout ``save_pretrained`` writes (transformers 5 fuses w1/w3 in memory only):
    per expert ``w1`` (gate), ``w3`` (up) ``[ffn, hidden]`` and ``w2`` (down)."""
    layer, hf = ("layers", "layers"), "model.layers.{i}"
    moe, experts = layer + ("block_sparse_moe",), hf + ".block_sparse_moe.experts.{e}"
    maps = [TensorMap(("embed_tokens", "embedding"), "model.embed_tokens.weight"),
            *_norm(layer + ("input_layernorm",), hf + ".input_layernorm", bias=False),
            *[m for p in ("q_proj", "k_proj", "v_proj", "o_proj")
              for m in _linear(layer + ("self_attn", p), f"{hf}.self_attn.{p}",
                               cfg.attention_bias)],
            *_norm(layer + ("post_attention_layernorm",), hf + ".post_attention_layernorm",
                   bias=False),
            *_linear(moe + ("gate",), hf + ".block_sparse_moe.gate", bias=False),
            TensorMap(moe + ("gate_proj",), experts + ".w1.weight", transpose=True),
            TensorMap(moe + ("up_proj",), experts + ".w3.weight", transpose=True),
            TensorMap(moe + ("down_proj",), experts + ".w2.weight", transpose=True),
            *_norm(("norm",), "model.norm", bias=False)]
    if not cfg.tie_word_embeddings:
        maps.append(TensorMap(("lm_head", "kernel"), "lm_head.weight", transpose=True))
    return maps


_TABLES = {"gpt_neox": _gpt_neox, "bloom": _bloom, "llama": _llama, "mixtral": _mixtral}
# The prefix of the base model's tensors (absent in checkpoints of the base model alone).
BASE_PREFIX = {"gpt_neox": "gpt_neox.", "bloom": "transformer.", "llama": "model.",
               "mixtral": "model."}
# Tensors that checkpoints may carry but that hold no parameter: rotary and mask
# buffers of older exports, and a tied head stored next to its embedding.
_IGNORED = {"gpt_neox": r"(rotary_emb\.inv_freq|attention\.bias|attention\.masked_bias)$",
            "bloom": r"^lm_head\.weight$",
            "llama": r"rotary_emb\.inv_freq$", "mixtral": r"rotary_emb\.inv_freq$"}


def tensor_maps(config: ModelConfig) -> list[TensorMap]:
    """Every parameter of ``config``'s model and the HF tensor(s) it comes from."""
    return _TABLES[family_of(config)](config)


def ignorable(config: ModelConfig, name: str) -> bool:
    """Whether an HF tensor that maps to no parameter may be skipped on import."""
    family = family_of(config)
    if family in ("llama", "mixtral") and config.tie_word_embeddings and name == "lm_head.weight":
        return True
    return re.search(_IGNORED[family], name) is not None
