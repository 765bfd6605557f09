"""The cross-entropy (jaxsmp/losses.py): values and every gradient against a float64
reference on fresh random inputs, equality with autodiff of the plain float32 loss, and
what its backward pass keeps."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxsmp
from jaxsmp.losses import (
    causal_lm_loss,
    cross_entropy,
    cross_entropy_reference,
    next_token_loss,
    next_token_loss_reference,
)

BATCH, SEQ, VOCAB = 2, 5, 11


def _reference(logits, targets, mask):
    """Masked mean negative log-likelihood in float64 numpy."""
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    return (nll * mask).sum() / mask.sum()


def _inputs(seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 3.0, (BATCH, SEQ, VOCAB))
    targets = rng.integers(0, VOCAB, (BATCH, SEQ))
    mask = (rng.random((BATCH, SEQ)) < 0.7).astype(np.float64)
    mask[0, 0] = 1.0
    return logits, targets, mask


@pytest.mark.parametrize("seed", [0, 1])
def test_value_and_gradient_match_a_float64_reference(seed):
    logits, targets, mask = _inputs(seed)
    value, grad = jax.value_and_grad(cross_entropy)(
        jnp.asarray(logits, jnp.float32), jnp.asarray(targets), jnp.asarray(mask))
    np.testing.assert_allclose(value, _reference(logits, targets, mask), rtol=1e-6)
    step, expected = 1e-6, np.zeros_like(logits)   # central differences, every element
    for j in np.ndindex(logits.shape):
        hi, lo = logits.copy(), logits.copy()
        hi[j] += step
        lo[j] -= step
        expected[j] = (_reference(hi, targets, mask) - _reference(lo, targets, mask)) / (2 * step)
    np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_it_equals_autodiff_of_the_plain_float32_loss_in_each_dtype(dtype):
    """Value in float32 and gradient in the logits' dtype, equal to the plain loss's:
    to float32 rounding, and to the logits dtype's rounding in the gradient."""
    logits, targets, mask = _inputs(2)
    x = jnp.asarray(logits, dtype)
    args = (jnp.asarray(targets), jnp.asarray(mask))
    ours, ours_grad = jax.value_and_grad(cross_entropy)(x, *args)
    ref, ref_grad = jax.value_and_grad(cross_entropy_reference)(x, *args)
    assert ours.dtype == jnp.float32 and ours_grad.dtype == dtype == ref_grad.dtype
    np.testing.assert_allclose(ours, ref, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(ours_grad, np.float32),
                               np.asarray(ref_grad, np.float32), rtol=1e-2, atol=1e-5)


def test_next_token_loss_equals_the_loss_of_the_sliced_logits():
    logits, targets, _ = _inputs(3)
    x, tokens = jnp.asarray(logits, jnp.float32), jnp.asarray(targets)
    ours, grad = jax.value_and_grad(next_token_loss)(x, tokens)
    ref, ref_grad = jax.value_and_grad(next_token_loss_reference)(x, tokens)
    np.testing.assert_allclose(ours, ref, rtol=1e-6)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-5, atol=1e-7)
    assert not np.any(grad[:, -1])   # the last position predicts nothing


def _float32_logit_residuals(loss, logits, tokens):
    residuals = jax.vjp(lambda x: loss(x, tokens), logits)[1]
    return [r for r in jax.tree.leaves(residuals)
            if r.dtype == jnp.float32 and r.size >= tokens.size * VOCAB // 2]


def test_the_backward_pass_keeps_no_float32_copy_of_bf16_logits():
    """Its residuals are the logits themselves and a float32 number per token; autodiff
    of the plain loss keeps the float32 logits (the last assertion: the check fails on
    it)."""
    logits = jnp.ones((BATCH, SEQ, VOCAB), jnp.bfloat16)
    tokens = jnp.zeros((BATCH, SEQ), jnp.int32)
    assert _float32_logit_residuals(next_token_loss, logits, tokens) == []
    assert _float32_logit_residuals(next_token_loss_reference, logits, tokens)


@pytest.mark.parametrize("family", ["gpt_neox", "bloom", "llama", "mixtral"])
def test_the_trainers_loss_takes_the_logits_in_the_compute_dtype(family):
    """causal_lm_loss runs on the model's compute-dtype logits (``model.logits``): its
    value is the plain loss of the float32 logits ``model(tokens)`` (the same numbers
    widened), and its backward pass keeps no float32 logits, which the same loss of
    ``model(tokens)`` does (the last assertion: the check fails on it)."""
    config = jaxsmp.models.preset(family, "tiny")
    tokens = jax.random.randint(jax.random.key(0), (2, 8), 0, config.vocab_size)
    graphdef, state = nnx.split(config.build(nnx.Rngs(0)))
    state = jax.tree.map(
        lambda v: v.astype(jnp.bfloat16) if jnp.issubdtype(v.dtype, jnp.floating) else v,
        state)
    model = nnx.merge(graphdef, state)
    assert model.logits(tokens).dtype == jnp.bfloat16

    def lm_loss(loss_fn):
        def f(state):
            loss = loss_fn(nnx.merge(graphdef, state), {"tokens": tokens})
            return loss[1]["lm_loss"] if isinstance(loss, tuple) else loss
        return f

    def float32_logits_kept(f):
        residuals = jax.vjp(f, state)[1]
        return [r for r in jax.tree.leaves(residuals) if r.dtype == jnp.float32
                and r.shape[-1:] == (config.vocab_size,) and r.size >= tokens.size * 4]

    widened = lm_loss(lambda m, b: next_token_loss_reference(m(b["tokens"]), b["tokens"]))
    np.testing.assert_allclose(lm_loss(causal_lm_loss)(state), widened(state), rtol=1e-6)
    assert float32_logits_kept(lm_loss(causal_lm_loss)) == []
    assert float32_logits_kept(widened)
