"""Llama 2: published parameter counts, grouped-query attention, sharded training."""
from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
from flax import nnx

import jaxsmp
from conftest import assert_causal, train
from jaxsmp.models import count_params, llama, preset


@pytest.mark.parametrize("name", sorted(llama.PUBLISHED_PARAMS))
def test_preset_parameter_counts_match_published(name):
    assert count_params(preset("llama", name)) == llama.PUBLISHED_PARAMS[name]


def _shapes(cfg) -> dict[str, tuple[int, ...]]:
    abstract = nnx.eval_shape(lambda: cfg.build(nnx.Rngs(0)))
    flat = jax.tree_util.tree_flatten_with_path(nnx.state(abstract, nnx.Param))[0]
    return {"/".join(str(getattr(k, "key", k)) for k in p[:-1]): x.shape for p, x in flat}


def test_70b_uses_grouped_query_attention():
    shapes = _shapes(preset("llama", "70b"))
    assert shapes["layers/layers/self_attn/q_proj/kernel"] == (80, 8192, 8192)
    assert shapes["layers/layers/self_attn/k_proj/kernel"] == (80, 8192, 1024)
    assert shapes["layers/layers/self_attn/v_proj/kernel"] == (80, 8192, 1024)


def test_tied_variant_drops_the_head():
    cfg = preset("llama", "tiny")
    tied = cfg.replace(tie_word_embeddings=True)
    assert count_params(cfg) - count_params(tied) == cfg.vocab_size * cfg.hidden_size
    model = tied.replace(attention_impl="reference").build(nnx.Rngs(0))
    assert model(np.zeros((1, 8), np.int32)).shape == (1, 8, 256)


def test_kv_heads_must_divide_heads():
    with pytest.raises(ValueError, match="num_key_value_heads 3"):
        preset("llama", "tiny", num_key_value_heads=3)


def _tiny():
    return preset("llama", "tiny", num_hidden_layers=2, attention_impl="reference")


def test_forward_is_causal_and_position_aware():
    model = jax.jit(_tiny().build(nnx.Rngs(0)).__call__)
    tokens, a = assert_causal(model)
    permuted = tokens.copy()
    permuted[:, :-1] = tokens[:, :-1][:, ::-1]  # rotary: order matters at the last position
    assert np.abs(np.asarray(model(permuted))[:, -1] - a[:, -1]).max() > 1e-3


def test_sequence_longer_than_maximum():
    model = _tiny().replace(max_position_embeddings=8).build(nnx.Rngs(0))
    with pytest.raises(ValueError, match="max_position_embeddings=8"):
        model(np.zeros((1, 9), np.int32))


def test_trains_on_sharded_mesh_with_gqa_heads_split_over_tp():
    tokens = np.random.default_rng(2).integers(0, 256, (8, 32)).astype(np.int32)
    state, losses = train(_tiny(), jaxsmp.Mesh(sdp=4, tp=2), tokens, steps=5,
                          tx=lambda: optax.adamw(3e-3))
    k = state.params["layers"]["layers"]["self_attn"]["k_proj"]["kernel"][...]
    assert k.shape == (2, 128, 64) and "tp" in str(k.sharding.spec)
    assert losses[-1] < losses[0] - 0.1, losses
