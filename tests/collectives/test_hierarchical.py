import jax
import jax.numpy as jnp
import pytest
from collectives_checks import DTYPES, check_against_xla

from collectives import Topology, hierarchical
from collectives.hierarchical import _group_perm


@pytest.mark.parametrize("mesh_key", ["x", "ab"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
def test_hierarchical_2x4_matches_xla(mesh_key, axis, dtype):
    check_against_xla("hierarchical", mesh_key, axis, dtype, topology=Topology(2, 4))


@pytest.mark.parametrize("topo", [Topology(4, 2), Topology(8, 1), Topology(1, 8)], ids=str)
def test_hierarchical_other_groupings_match_xla(topo):
    check_against_xla("hierarchical", "x", 1, jnp.float32, topology=topo)


def test_group_perm_stays_in_group():
    # 8 ranks, 2 hosts x 4: across-host groups are {l, l+4}, in-host groups {4h..4h+3}
    assert _group_perm(8, 4, 2, 1) == [(r, (r + 4) % 8) for r in range(8)]
    within = _group_perm(8, 1, 4, 1)
    assert all(src // 4 == dst // 4 for src, dst in within)
    assert sorted(dst for _, dst in within) == list(range(8))


def test_group_size_must_divide_axis():
    mesh = jax.make_mesh((8,), ("x",))
    x = jax.device_put(jnp.zeros(8), jax.NamedSharding(mesh, jax.P("x")))
    f = jax.shard_map(lambda v: hierarchical.all_gather(v, "x", 0, 3), mesh=mesh,
                      in_specs=jax.P("x"), out_specs=jax.P("x"))
    with pytest.raises(ValueError, match="does not divide"):
        f(x)


@pytest.mark.parametrize("mesh_key", ["b", "a"])
def test_hierarchical_smaller_axes_match_xla(mesh_key):
    check_against_xla("hierarchical", mesh_key, 2, jnp.float32, topology=Topology(2, 2))
