"""Every parallel configuration trains like the single-device run.

Tolerances: losses agree to rtol 1e-5; parameters after 3 AdamW steps (lr 1e-3)
agree to atol 2e-4 (AdamW's normalised update turns float32 reduction-order
noise in tiny gradients into up to ~1e-4 parameter differences).
"""
import numpy as np
import pytest

import jaxsmp
from conftest import leaves, single_device_mesh, train


@pytest.fixture(scope="module")
def reference(tiny_config, tokens):
    return train(tiny_config, single_device_mesh(), tokens)


@pytest.mark.parametrize("degrees", [dict(sdp=8), dict(sdp=4, tp=2), dict(dp=2, sdp=2, tp=2),
                                     dict(dp=4, sdp=1, tp=2)],
                         ids=["sdp8", "sdp4-tp2", "dp2-sdp2-tp2", "dp4-tp2"])
def test_matches_single_device(tiny_config, tokens, reference, degrees):
    ref_state, ref_losses = reference
    state, losses = train(tiny_config, jaxsmp.Mesh(**degrees), tokens)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    assert losses[-1] < losses[0]
    for a, b in zip(leaves(state), leaves(ref_state)):
        np.testing.assert_allclose(a, b, atol=2e-4)


def test_blockwise_attention_trains_like_reference(tiny_config, tokens, reference):
    # Models default to attention_impl="auto" (blockwise on CPU, Pallas on GPU); the
    # blockwise online-softmax attention inside the sharded step gives the losses of
    # plain softmax attention (rtol 1e-5).
    assert jaxsmp.models.preset("gpt_neox", "tiny").attention_impl == "auto"
    config = tiny_config.replace(attention_impl="blockwise")
    _, losses = train(config, jaxsmp.Mesh(sdp=4, tp=2), tokens)
    np.testing.assert_allclose(losses, reference[1], rtol=1e-5)
