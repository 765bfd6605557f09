import jax.numpy as jnp
import pytest
from collectives_checks import DTYPES, check_against_xla


@pytest.mark.parametrize("mesh_key", ["x", "ab"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_ring_matches_xla(mesh_key, axis, dtype):
    check_against_xla("ring", mesh_key, axis, dtype)


@pytest.mark.parametrize("mesh_key", ["b", "a"])
def test_ring_smaller_axes_match_xla(mesh_key):
    check_against_xla("ring", mesh_key, 2, jnp.float32)
