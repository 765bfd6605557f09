import jax.numpy as jnp
import pytest

from conftest import DTYPES


@pytest.mark.parametrize("mesh_key", ["x", "ab"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_ring_matches_xla(against_xla, mesh_key, axis, dtype):
    against_xla("ring", mesh_key, axis, dtype)
