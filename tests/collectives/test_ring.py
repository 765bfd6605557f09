import jax.numpy as jnp
import pytest

from collectives_checks import DTYPES, check_against_xla


@pytest.mark.parametrize("mesh_key", ["x", "ab"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_ring_matches_xla(mesh_key, axis, dtype):
    check_against_xla("ring", mesh_key, axis, dtype)
