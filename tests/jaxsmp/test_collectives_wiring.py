"""The sdp gather / reduce-scatter runs through every collectives algorithm, bucketed
or per parameter, and training gives the losses of XLA's own collectives (rtol 1e-5)."""
import numpy as np
import pytest

import jaxsmp
from conftest import train


@pytest.fixture(scope="module")
def xla_losses(tiny_config, tokens):
    return train(tiny_config, jaxsmp.Mesh(dp=2, sdp=4, collectives="xla"), tokens,
                 bucket=False)[1]


@pytest.mark.parametrize("algorithm, bucket", [
    ("xla", True), ("ring", False), ("a2a", True), ("hierarchical", True), ("auto", True)])
def test_algorithms_train_like_xla(tiny_config, tokens, xla_losses, algorithm, bucket):
    mesh = jaxsmp.Mesh(dp=2, sdp=4, collectives=algorithm)
    _, losses = train(tiny_config, mesh, tokens, bucket=bucket)
    np.testing.assert_allclose(losses, xla_losses, rtol=1e-5)


def test_step_option_overrides_the_mesh(tiny_config, tokens, xla_losses):
    _, losses = train(tiny_config, jaxsmp.Mesh(dp=2, sdp=4), tokens, collectives="ring")
    np.testing.assert_allclose(losses, xla_losses, rtol=1e-5)


def test_unknown_algorithm(tiny_config, tokens):
    with pytest.raises(ValueError, match=r"unknown collectives algorithm 'fast'"):
        train(tiny_config, jaxsmp.Mesh(sdp=8, collectives="fast"), tokens, steps=1)
