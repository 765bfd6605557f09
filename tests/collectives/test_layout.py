import jax.numpy as jnp
import numpy as np
import pytest

from collectives.layout import order_received, stack_to_tiled, tiled_to_stack


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_tiled_stack_roundtrip_matches_concatenate(axis):
    blocks = np.random.default_rng(0).standard_normal((4, 3, 5, 7)).astype(np.float32)
    tiled = stack_to_tiled(jnp.asarray(blocks), axis)
    np.testing.assert_array_equal(tiled, np.concatenate(list(blocks), axis=axis))
    np.testing.assert_array_equal(tiled_to_stack(tiled, 4, axis), blocks)


def test_tiled_to_stack_rejects_indivisible():
    with pytest.raises(ValueError, match="not divisible"):
        tiled_to_stack(jnp.zeros((3, 5)), 2, 1)


def test_order_received():
    # position 2 of 4 received chunk k from position 2 - k
    chunks = [jnp.array(v) for v in (2, 1, 0, 3)]
    np.testing.assert_array_equal(order_received(chunks, jnp.array(2)), [0, 1, 2, 3])
