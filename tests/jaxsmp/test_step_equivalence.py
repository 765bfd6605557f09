"""Every parallel configuration computes the single-device gradients and trains alike.

Gradient level (the check that sees a wrong gradient scale, which AdamW hides): the
first step's float32 gradient of every parameter, gathered to the host, is within
1e-5 of that parameter's largest single-device gradient (observed <= 1.1e-6), and
``grad_norm`` agrees to rtol 1e-5. Multi-step: losses agree to rtol 1e-5 and
parameters after 3 AdamW steps (lr 1e-3) to atol 2e-4 (AdamW's normalised update
turns float32 reduction-order noise in tiny gradients into ~1e-4 differences).

Tiny GPT-NeoX with 4 layers. The full step users run (update applied) is checked on
these and more meshes in ``test_full_step_equivalence.py``; this file keeps the
``step.gradients()`` cases that matrix does not repeat.
"""
import functools

import jax
import numpy as np
import pytest

import jaxsmp
from conftest import assert_gradients_match, gradients, leaves, single_device_mesh, train

# meshes test_full_step_equivalence.py's matrix runs (sdp8, dp2-sdp2-tp2, the pp2-sdp4
# schedules, tp8 with sequence parallelism) are not repeated here
MESHES = {
    "sdp4-tp2": (dict(sdp=4, tp=2), {}),
    "dp4-tp2": (dict(dp=4, tp=2), {}),
    "tp8": (dict(tp=8), {}),
    "dp2-tp4": (dict(dp=2, tp=4), {}),
    "pp2-sdp2-tp2": (dict(pp=2, sdp=2, tp=2), dict(microbatches=4)),
    "sdp4-tp2-seqpar": (dict(sdp=4, tp=2), dict(sequence_parallel=True)),
    "pp2-sdp2-tp2-seqpar": (dict(pp=2, sdp=2, tp=2), dict(microbatches=4,
                                                         sequence_parallel=True)),
}


@pytest.fixture(scope="module")
def config(tiny_config):
    return tiny_config.replace(num_hidden_layers=4)


@pytest.fixture(scope="module")
def reference_gradients(config, tokens):
    return gradients(config, single_device_mesh(), tokens)


@pytest.mark.parametrize("name", list(MESHES))
def test_gradients_match_single_device(config, tokens, reference_gradients, name):
    degrees, options = MESHES[name]
    got = gradients(config, jaxsmp.Mesh(**degrees), tokens, **options)
    assert_gradients_match(got, reference_gradients)
    assert got[1]["loss"] == pytest.approx(reference_gradients[1]["loss"], rel=1e-5)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _scale_gradient(x, factor):
    return x


_scale_gradient.defvjp(lambda x, factor: (x, None), lambda factor, _, g: (g * factor,))


def test_gradient_check_fails_on_scaled_gradients(config, tokens, reference_gradients):
    # The mutant the AdamW comparisons cannot see: the same loss, every gradient x 8.
    def mutant(model, batch):
        return _scale_gradient(jaxsmp.losses.causal_lm_loss(model, batch), 8.0)
    got = gradients(config, jaxsmp.Mesh(sdp=8), tokens, loss=mutant)
    assert got[1]["loss"] == pytest.approx(reference_gradients[1]["loss"], rel=1e-5)
    with pytest.raises(AssertionError, match="gradient of parameter"):
        assert_gradients_match(got, reference_gradients)


@pytest.fixture(scope="module")
def reference(tiny_config, tokens):
    return train(tiny_config, single_device_mesh(), tokens)


@pytest.mark.parametrize("degrees", [dict(sdp=4, tp=2), dict(dp=4, sdp=1, tp=2), dict(tp=8)],
                         ids=["sdp4-tp2", "dp4-tp2", "tp8"])
def test_adamw_training_matches_single_device(tiny_config, tokens, reference, degrees):
    ref_state, ref_losses = reference
    state, losses = train(tiny_config, jaxsmp.Mesh(**degrees), tokens)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    assert losses[-1] < losses[0]
    for a, b in zip(leaves(state), leaves(ref_state)):
        np.testing.assert_allclose(a, b, atol=2e-4)


FAMILIES = {"gpt_neox": dict(num_hidden_layers=2), "bloom": dict(n_layer=2),
            "llama": dict(num_hidden_layers=2)}  # rotary; ALiBi; grouped-query attention


@pytest.mark.parametrize("family, impl, degrees", [
    ("gpt_neox", "blockwise", dict(sdp=4, tp=2)), ("gpt_neox", "pallas", dict(sdp=4, tp=2)),
    ("bloom", "pallas", dict(sdp=4, tp=2)), ("llama", "pallas", dict(sdp=4, tp=2)),
    ("llama", "pallas", dict(sdp=2, tp=4)),   # 2 kv heads repeated over tp=4
    ("bloom", "pallas", dict(tp=8)),           # 4 heads: the kernel splits the batch over tp
    ("gpt_neox", "pallas", dict(pp=2, sdp=4))])
def test_attention_kernels_train_like_reference_attention(tokens, family, impl, degrees):
    # The kernels inside the sharded step (Pallas in interpret mode on CPU, per device:
    # jaxsmp.train.attention) give the loss (rtol 1e-5) and gradients of plain softmax
    # attention on one device.
    config = jaxsmp.models.preset(family, "tiny", attention_impl="reference", **FAMILIES[family])
    options = dict(microbatches=2) if degrees.get("pp", 1) > 1 else {}
    got = gradients(config.replace(attention_impl=impl), jaxsmp.Mesh(**degrees), tokens,
                    **options)
    want = gradients(config, single_device_mesh(), tokens)
    assert_gradients_match(got, want)
    assert got[1]["loss"] == pytest.approx(want[1]["loss"], rel=1e-5)
