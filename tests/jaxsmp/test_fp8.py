"""FP8 matmuls (jaxsmp.nn.fp8): scales from the amax history by hand, the float8 dot and
its gradients against a float64 reference of the same quantization, the observations
it sends back, and one layer's forward in fp8 against bf16."""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx

import jaxsmp
from jaxsmp.nn import fp8
from jaxsmp.nn.layer_context import LayerContext, layer_context


def test_scale_follows_the_largest_amax_of_the_history():
    history = jnp.array([[0.5, 448.0 * 2, 3.0], [0.0, 0.0, 0.0], [1.0, 0.25, np.inf]])
    scale = fp8.scale_from_history(history, jnp.float8_e4m3fn)
    # 896 / 448 = 2; an empty history scales by 1; a non-finite amax is not used
    np.testing.assert_array_equal(np.asarray(scale), [2.0, 1.0, 1.0])
    assert fp8.scale_from_history(jnp.array([57344.0 / 4]), jnp.float8_e5m2) == 0.25


def test_roll_puts_the_new_amax_first_and_drops_the_oldest():
    history = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    np.testing.assert_array_equal(fp8.roll_history(history, jnp.array([7.0, 8.0])),
                                  [[7.0, 1.0, 2.0], [8.0, 4.0, 5.0]])


def _q(x, dtype, scale):  # the same quantization in numpy: float64 -> float8 -> float64
    top = float(ml_dtypes.finfo(dtype).max)
    return np.clip(np.asarray(x, np.float64) / scale, -top, top).astype(dtype).astype(
        np.float64) * scale


def _history(ax, aw, ag, n=4):
    return jnp.zeros((3, n)).at[:, 1].set(jnp.array([ax, aw, ag]))


def test_fp8_dot_and_its_gradients_equal_a_float64_reference_of_the_quantized_operands():
    kx, kw, kg = jax.random.split(jax.random.key(7), 3)
    x = jax.random.normal(kx, (3, 5, 32), jnp.float32)
    w = jax.random.normal(kw, (32, 48), jnp.float32) * 0.1
    dy = jax.random.normal(kg, (3, 5, 48), jnp.float32) * 1e-3
    history = _history(4.0, 0.5, 5e-3)
    sx, sw, sg = 4.0 / 448, 0.5 / 448, 5e-3 / 57344
    y, pull = jax.vjp(lambda x, w, h: fp8.fp8_dot(x, w, h, jnp.float32), x, w, history)
    dx, dw, observed = pull(dy)
    qx, qw = _q(x, ml_dtypes.float8_e4m3fn, sx), _q(w, ml_dtypes.float8_e4m3fn, sw)
    qg = _q(dy, ml_dtypes.float8_e5m2, sg)
    np.testing.assert_allclose(y, qx @ qw, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx, qg @ qw.T, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(dw, np.einsum("bsi,bso->io", qx, qg), rtol=1e-5, atol=1e-9)
    # the history's cotangent is this call's observation, in column 0
    want = [np.abs(x).max(), np.abs(w).max(), np.abs(dy).max()]
    np.testing.assert_allclose(observed[:, 0], want, rtol=1e-6)
    assert not np.any(observed[:, 1:])


def test_a_call_whose_output_never_reaches_the_loss_observes_nothing():
    x, w = jnp.ones((4, 8)), jnp.ones((8, 2))
    _, pull = jax.vjp(lambda h: fp8.fp8_dot(x, w, h, jnp.float32), _history(1, 1, 1))
    assert not np.any(pull(jnp.zeros((4, 2)))[0])


def test_values_beyond_the_delayed_scale_saturate_at_the_float8_maximum():
    x = jnp.array([[1000.0]])
    y = fp8.fp8_dot(x, jnp.ones((1, 1)), _history(1.0, 1.0, 1.0), jnp.float32)
    np.testing.assert_allclose(y, [[1.0]], rtol=0)  # x / (1 / 448) clipped to 448


def test_one_layer_in_fp8_matches_bf16_within_what_float8_allows():
    config = jaxsmp.models.preset("gpt_neox", "tiny")
    model = config.build(nnx.Rngs(0))
    layer_def, stacked = nnx.split(model.layers.layers)
    one = jax.tree.map(lambda a: a[0], stacked)
    x = jax.random.normal(jax.random.key(1), (2, 16, config.hidden_size), jnp.bfloat16)
    cos, sin = jaxsmp.nn.rotary_for_tokens(jnp.zeros((2, 16), jnp.int32), 8, 10000.0, 64)
    layer = nnx.merge(layer_def, jax.tree.map(lambda a: a.astype(jnp.bfloat16), one))
    reference = layer(x, cos, sin)
    for _, module in nnx.iter_modules(layer):
        if isinstance(module, jaxsmp.nn.Linear):  # histories of the inputs it will see
            module.fp8 = nnx.data(fp8.Fp8Meta(_history(8.0, 0.1, 1.0, n=2)))
    with layer_context(LayerContext(fp8=True)):
        out = layer(x, cos, sin)
    update = (out - x).astype(jnp.float32)
    error = jnp.linalg.norm(update - (reference - x)) / jnp.linalg.norm(reference - x)
    assert 0 < float(error) < 0.1  # e4m3: 3 mantissa bits, ~6% per element at worst
    with layer_context(LayerContext(fp8=False)):  # without the context: bf16 again
        np.testing.assert_array_equal(layer(x, cos, sin), reference)


@pytest.mark.parametrize("history", [0, -1, 1.5])
def test_bad_history_lengths_are_refused_by_name(history):
    from jaxsmp.train.fp8_state import with_fp8
    with pytest.raises(ValueError, match=f"fp8_history must be a positive integer, got {history}"):
        with_fp8(None, history)
