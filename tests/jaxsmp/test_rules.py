"""Logical axis names -> mesh axes: Megatron tensor parallelism, ZeRO-3 completion."""
import pytest
from jax.sharding import PartitionSpec as P

from jaxsmp.sharding import DEFAULT_RULES, resolve_spec

MESH = {"dp": 1, "pp": 1, "sdp": 4, "tp": 2}


@pytest.mark.parametrize("axes, shape, expected", [
    (("embed", "heads"), (128, 384), P("sdp", "tp")),          # QKV: column-parallel
    (("heads", "embed"), (128, 128), P("tp", "sdp")),          # attention out: row-parallel
    (("embed", "mlp"), (128, 512), P("sdp", "tp")),            # MLP in: column-parallel
    (("mlp", "embed"), (512, 128), P("tp", "sdp")),            # MLP out: row-parallel
    (("vocab", "embed"), (256, 128), P("tp", "sdp")),          # vocabulary-parallel
    (("layers", "embed", "mlp"), (4, 128, 512), P(None, "sdp", "tp")),
])
def test_megatron_layouts(axes, shape, expected):
    assert resolve_spec("w", axes, shape, MESH) == expected


def test_every_parameter_is_sharded_over_sdp():
    # A bias on a tp axis still gets split over sdp (sdp major), never replicated.
    assert resolve_spec("b", ("mlp",), (512,), MESH) == P(("sdp", "tp"))
    # The stacked-layer axis is never the sdp axis: each layer is gathered alone.
    assert resolve_spec("b", ("layers", "mlp"), (8, 512), MESH) == P(None, ("sdp", "tp"))


def test_size_one_axes_are_dropped():
    assert resolve_spec("w", ("embed", "mlp"), (128, 512), {"sdp": 8, "tp": 1}) == P("sdp", None)


def test_user_rules_override():
    rules = {**DEFAULT_RULES, "mlp": None, "embed": ("sdp", "tp")}
    assert resolve_spec("w", ("embed", "mlp"), (128, 512), MESH, rules) == P(("sdp", "tp"), None)


def test_indivisible_dimension_is_an_error():
    with pytest.raises(ValueError, match=r"'w'.*'mlp' of size 511.*\('tp',\)"):
        resolve_spec("w", ("embed", "mlp"), (128, 511), MESH)


def test_unshardable_parameter_is_an_error():
    with pytest.raises(ValueError, match=r"no dimension divisible by sdp=4"):
        resolve_spec("w", ("norm",), (6,), MESH)


def test_unknown_logical_axis():
    with pytest.raises(ValueError, match=r"logical axis 'bogus' has no rule"):
        resolve_spec("w", ("bogus",), (8,), MESH)


def test_zero3_shards_over_sdp_and_cp_together():
    mesh = {"dp": 1, "pp": 1, "sdp": 2, "cp": 2, "tp": 2}
    assert resolve_spec("w", ("embed", "mlp"), (128, 512), mesh) == P(("sdp", "cp"), "tp")
    assert resolve_spec("n", ("norm",), (128,), mesh) == P(("sdp", "cp"))
    assert resolve_spec("n", ("norm",), (128,), {**mesh, "sdp": 1}) == P("cp")
    with pytest.raises(ValueError, match=r"no dimension divisible by sdp=2 x cp=2"):
        resolve_spec("b", ("norm",), (6,), mesh)


def test_experts_go_to_ep_with_zero3_over_sdp_inside_and_the_router_is_replicated():
    mesh = {"dp": 1, "pp": 1, "ep": 2, "sdp": 4, "tp": 2}
    experts = ("layers", "experts", "embed", "mlp")
    assert resolve_spec("w", experts, (2, 4, 128, 256), mesh) == P(None, "ep", "sdp", "tp")
    assert resolve_spec("g", ("embed", "router"), (128, 4), mesh) == P("sdp", None)
    with pytest.raises(ValueError, match=r"'experts' of size 4 is not divisible.*\('ep',\)"):
        resolve_spec("w", experts, (2, 4, 128, 256), {**mesh, "ep": 8})
