"""The sdp gather / reduce-scatter runs through every collectives algorithm, bucketed
or per parameter, and gives the gradients (within 1e-5 of each parameter's largest,
grad_norm rtol 1e-5) and training losses (rtol 1e-5) of XLA's own collectives."""
import numpy as np
import pytest

import jaxsmp
from conftest import assert_gradients_match, gradients, train


@pytest.fixture(scope="module")
def xla_losses(tiny_config, tokens):
    return train(tiny_config, jaxsmp.Mesh(dp=2, sdp=4, collectives="xla"), tokens,
                 bucket=False)[1]


@pytest.fixture(scope="module")
def xla_gradients(tiny_config, tokens):
    return gradients(tiny_config, jaxsmp.Mesh(dp=2, sdp=4, collectives="xla"), tokens,
                     bucket=False)


@pytest.mark.parametrize("algorithm, bucket", [
    ("xla", True), ("ring", False), ("a2a", True), ("hierarchical", True), ("auto", True)])
def test_algorithms_give_xla_gradients_and_losses(tiny_config, tokens, xla_gradients,
                                                   xla_losses, algorithm, bucket):
    mesh = jaxsmp.Mesh(dp=2, sdp=4, collectives=algorithm)
    assert_gradients_match(gradients(tiny_config, mesh, tokens, bucket=bucket), xla_gradients)
    _, losses = train(tiny_config, mesh, tokens, bucket=bucket)
    np.testing.assert_allclose(losses, xla_losses, rtol=1e-5)


def test_step_option_overrides_the_mesh(tiny_config, tokens, xla_losses):
    _, losses = train(tiny_config, jaxsmp.Mesh(dp=2, sdp=4), tokens, collectives="ring")
    np.testing.assert_allclose(losses, xla_losses, rtol=1e-5)


def test_unknown_algorithm_is_refused_by_the_mesh():
    with pytest.raises(ValueError, match=r"unknown collectives algorithm 'fast'; valid: \["):
        jaxsmp.Mesh(sdp=8, collectives="fast")
