"""GPT-NeoX: published parameter counts, shapes, scan over layers, input checks."""
import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from conftest import assert_causal
from jaxsmp.models import count_params, preset
from jaxsmp.models.gpt_neox import PRESETS, PUBLISHED_PARAMS


@pytest.mark.parametrize("name", sorted(PUBLISHED_PARAMS))
def test_preset_parameter_counts_match_published(name):
    assert count_params(preset("gpt_neox", name)) == PUBLISHED_PARAMS[name]


def test_large_presets_have_their_nominal_size():
    assert abs(count_params(preset("gpt_neox", "13b")) / 13.1e9 - 1) < 0.01
    assert abs(count_params(preset("gpt_neox", "100b")) / 100e9 - 1) < 0.03
    assert set(PRESETS) >= {"tiny", "125m", "1.3b", "2.7b", "6.9b", "13b", "20b", "100b"}


def test_unknown_preset_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"unknown gpt_neox preset 'huge'.*'tiny'"):
        preset("gpt_neox", "huge")


def test_forward_shape_and_causality(tiny_config):
    assert_causal(jax.jit(tiny_config.build(nnx.Rngs(0)).__call__))


def test_sequence_longer_than_maximum(tiny_config):
    model = tiny_config.replace(max_position_embeddings=8).build(nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"sequence length 16 exceeds.*=8"):
        model(jnp.zeros((1, 16), jnp.int32))


def test_compile_time_does_not_grow_with_depth(tiny_config):
    # Layers are scanned: the lowered program has one layer body whatever the depth.
    def hlo_size(layers):
        cfg = tiny_config.replace(num_hidden_layers=layers)
        model = cfg.build(nnx.Rngs(0))
        graphdef, state = nnx.split(model)
        f = lambda s, t: nnx.merge(graphdef, s)(t)
        return len(jax.jit(f).lower(state, jnp.zeros((1, 8), jnp.int32)).as_text())
    assert abs(hlo_size(8) - hlo_size(2)) < 0.02 * hlo_size(2)


@pytest.mark.parametrize("tokens", [jnp.zeros((16,), jnp.int32), jnp.zeros((1, 16), jnp.float32)])
def test_model_takes_integer_token_ids_of_rank_two(tiny_config, tokens):
    model = tiny_config.build(nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"tokens must be integer ids of shape \[batch, seq\]"):
        model(tokens)
