import jax
import jax.numpy as jnp
import numpy as np
import pytest
from collectives_checks import check_against_xla
from jax.sharding import NamedSharding, PartitionSpec as P

import collectives
from collectives import Topology

ALGOS = ["ring", "a2a", "hierarchical", "auto"]


@pytest.mark.parametrize("algorithm", ALGOS)
def test_manual_dp_sdp_auto_tp_like_jaxsmp(algorithm):
    """jaxsmp's call site: shard_map manual over ('dp', 'sdp'), automatic over 'tp'."""
    mesh = jax.make_mesh((2, 2, 2), ("dp", "sdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 3)
    x = jax.device_put(np.random.default_rng(0).standard_normal((8, 6, 4)).astype(np.float32),
                       NamedSharding(mesh, P(("dp", "sdp"), None, "tp")))

    def body(name):
        def f(v):
            v = jax.lax.with_sharding_constraint(v, P(None, None, "tp"))  # tp stays automatic
            full = collectives.all_gather(v, ("dp", "sdp"), axis=0, algorithm=name)
            return collectives.reduce_scatter(full * full, "sdp", axis=1, algorithm=name)
        sm = jax.shard_map(f, mesh=mesh, in_specs=P(("dp", "sdp")), out_specs=P(("dp", "sdp")),
                           axis_names={"dp", "sdp"})
        return jax.jit(lambda v: jnp.sum(sm(v) ** 2)), jax.jit(jax.grad(lambda v: jnp.sum(sm(v) ** 2)))

    (loss, grad), (ref_loss, ref_grad) = body(algorithm), body("xla")
    np.testing.assert_allclose(loss(x), ref_loss(x), rtol=1e-5)
    np.testing.assert_allclose(grad(x), ref_grad(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("algorithm", ["ring", "a2a", "hierarchical"])
def test_without_vma_checking(algorithm):
    mesh = jax.make_mesh((8,), ("x",))
    x = jax.device_put(jnp.arange(8 * 6.0).reshape(8, 6), NamedSharding(mesh, P("x")))

    def run(name):
        f = lambda v: collectives.all_gather(v, "x", axis=1, algorithm=name,
                                             topology=Topology(2, 4))
        sm = jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)
        return jax.jit(jax.grad(lambda v: jnp.sum(sm(v) * jnp.arange(48.0))))(x)
    np.testing.assert_allclose(run(algorithm), run("xla"))


def test_auto_matches_xla():
    check_against_xla("auto", "ab", 1, jnp.float32)


def test_unknown_algorithm_lists_valid_names():
    mesh = jax.make_mesh((8,), ("x",))
    x = jax.device_put(jnp.zeros(8), NamedSharding(mesh, P("x")))
    f = jax.shard_map(lambda v: collectives.all_gather(v, "x", algorithm="nccl"), mesh=mesh,
                      in_specs=P("x"), out_specs=P("x"))
    with pytest.raises(ValueError, match="valid: .*hierarchical"):
        f(x)


def test_axis_topology_inside_shard_map():
    mesh = jax.make_mesh((2, 4), ("a", "b"))
    seen = {}

    def f(v):
        seen["b"] = collectives.axis_topology("b", Topology(2, 4))
        seen["ab"] = collectives.axis_topology(("a", "b"), Topology(2, 4))
        seen["default"] = collectives.axis_topology(("a", "b"))
        return v
    jax.shard_map(f, mesh=mesh, in_specs=P(("a", "b")), out_specs=P(("a", "b")))(
        jax.device_put(jnp.zeros(8), NamedSharding(mesh, P(("a", "b")))))
    assert seen == {"b": Topology(1, 4), "ab": Topology(2, 4), "default": Topology(1, 8)}


def test_scope_mesh_gives_host_groups_from_devices_and_ends_with_the_block():
    class Dev:
        def __init__(self, process_index):
            self.process_index = process_index
    devices = np.array([Dev(i // 4) for i in range(8)], dtype=object).reshape(2, 2, 2)
    fake = type("FakeMesh", (), {"devices": devices, "axis_names": ("dp", "sdp", "tp"),
                                 "shape": {"dp": 2, "sdp": 2, "tp": 2}})()
    mesh = jax.make_mesh((2, 2, 2), ("dp", "sdp", "tp"))
    seen = {}

    def f(v):
        seen["sdp"] = collectives.axis_topology("sdp")
        seen["dp_sdp"] = collectives.axis_topology(("dp", "sdp"))
        return v
    x = jax.device_put(jnp.zeros(8), NamedSharding(mesh, P(("dp", "sdp", "tp"))))
    run = jax.shard_map(f, mesh=mesh, in_specs=P(("dp", "sdp", "tp")),
                        out_specs=P(("dp", "sdp", "tp")))
    with collectives.scope(mesh=fake):
        run(x)
    # hosts of 4 devices, tp innermost: 2 sdp ranks per host; dp goes across hosts
    assert seen == {"sdp": Topology(1, 2), "dp_sdp": Topology(2, 2)}
    run(x)  # outside the block: one process, so one host
    assert seen == {"sdp": Topology(1, 2), "dp_sdp": Topology(1, 4)}
