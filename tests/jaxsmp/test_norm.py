"""LayerNorm and RMSNorm (jaxsmp/nn/norm.py): values and every gradient against a float64
reference on fresh random inputs, and what the backward pass keeps of them."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxsmp.nn import LayerNorm, RMSNorm
from jaxsmp.nn.norm import layer_norm_reference, rms_norm_reference

TOKENS, DIM, EPS = 6, 32, 1e-5


def _reference(kind, x, scale, bias):
    """The textbook norms in float64 numpy."""
    if kind == "layer":
        centred = x - x.mean(-1, keepdims=True)
        y = centred / np.sqrt(np.square(centred).mean(-1, keepdims=True) + EPS)
        return y * scale + bias
    return x / np.sqrt(np.square(x).mean(-1, keepdims=True) + EPS) * scale


def _inputs(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(1.5, 2.0, (TOKENS, DIM))
    return x, rng.normal(1.0, 0.3, DIM), rng.normal(0.0, 0.3, DIM), rng.normal(size=(TOKENS, DIM))


def _applied(kind):
    """``f(x, scale, bias)``: the module with those parameters, applied to ``x``."""
    graphdef, state = nnx.split((LayerNorm if kind == "layer" else RMSNorm)(
        DIM, eps=EPS, rngs=nnx.Rngs(0)))

    def f(x, scale, bias):
        params = {"scale": scale} | ({"bias": bias} if kind == "layer" else {})
        new = jax.tree.map(lambda v: v, state)
        for name, value in params.items():
            new[name] = new[name].replace(value)
        return nnx.merge(graphdef, new)(x)
    return f


def _loss(kind, dy):
    applied = _applied(kind)
    return lambda x, scale, bias: jnp.sum(applied(x, scale, bias) * dy)


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_values_and_every_gradient_match_a_float64_reference(kind):
    x, scale, bias, dy = _inputs(sum(map(ord, kind)))
    ref = lambda x, scale, bias: np.sum(_reference(kind, x, scale, bias) * dy)
    args = [jnp.asarray(a, jnp.float32) for a in (x, scale, bias)]
    value, grads = jax.value_and_grad(_loss(kind, jnp.asarray(dy, jnp.float32)),
                                      argnums=(0, 1, 2))(*args)
    np.testing.assert_allclose(value, ref(x, scale, bias), rtol=1e-5)
    step = 1e-6   # central differences of the float64 reference, every element
    for i, (arg, grad) in enumerate(zip((x, scale, bias), grads)):
        if kind == "rms" and i == 2:
            assert not np.any(grad)   # RMSNorm has no bias
            continue
        expected = np.zeros_like(arg)
        for j in np.ndindex(arg.shape):
            hi, lo = [list((x, scale, bias)) for _ in range(2)]
            hi[i], lo[i] = arg.copy(), arg.copy()
            hi[i][j] += step
            lo[i][j] -= step
            expected[j] = (ref(*hi) - ref(*lo)) / (2 * step)
        np.testing.assert_allclose(grad, expected, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_the_backward_pass_keeps_no_hidden_sized_float32_tensor(kind):
    """The residuals of a bfloat16 input are the input itself and per-token float32
    statistics: nothing float32 of the input's size, which autodiff of the plain float32
    computation keeps (the last assertion: this check fails on it)."""
    x = jnp.ones((TOKENS, DIM), jnp.bfloat16)
    scale = jnp.ones(DIM, jnp.float32)

    def hidden_f32(f):
        residuals = jax.vjp(f, x, scale)[1]
        return [r for r in jax.tree.leaves(residuals)
                if r.dtype == jnp.float32 and r.size >= TOKENS * DIM]

    applied = _applied(kind)
    assert hidden_f32(lambda x, scale: applied(x, scale, scale)) == []
    plain = (lambda x, s: layer_norm_reference(x, s, s, EPS)) if kind == "layer" else (
        lambda x, s: rms_norm_reference(x, s, EPS))
    assert hidden_f32(plain)


@pytest.mark.parametrize("kind", ["layer", "rms"])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_the_norms_equal_autodiff_of_the_plain_computation_in_each_dtype(kind, dtype):
    """Values and gradients (input, scale, bias) equal those of the plain computation:
    bitwise in value, within float32 rounding in gradient, bfloat16's where the input is."""
    x, scale, bias, dy = (jnp.asarray(a, dtype) for a in _inputs(7))
    plain = (lambda x, s, b: layer_norm_reference(x, s, b, EPS)) if kind == "layer" else (
        lambda x, s, b: rms_norm_reference(x, s, EPS))
    applied = _applied(kind)
    ours, ours_vjp = jax.vjp(applied, x, scale, bias)
    ref, ref_vjp = jax.vjp(plain, x, scale, bias)
    np.testing.assert_array_equal(np.asarray(ours, np.float32), np.asarray(ref, np.float32))
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    for a, b in zip(ours_vjp(dy), ref_vjp(dy)):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                                   rtol=tol, atol=tol * float(np.abs(np.asarray(b, np.float32)).max()))
