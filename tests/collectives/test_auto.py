import pytest

import collectives
from collectives import CostModel, Topology, choose, decide, explain
from collectives.profile import cached_path

TWO_HOSTS = Topology(2, 8)


@pytest.fixture(autouse=True)
def empty_profile_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXSMP_COLLECTIVES_PROFILE_DIR", str(tmp_path))


def test_choice_follows_message_size_and_topology():
    m = CostModel.p4d()
    assert choose(1024, TWO_HOSTS, m) == "a2a"              # latency bound: a single round
    assert choose(16 << 20, TWO_HOSTS, m) == "hierarchical"  # fewest cross-host bytes
    # many hosts, large messages: ring-like bandwidth optimum; XLA's (NCCL ring) wins the tie
    assert choose(64 << 20, Topology(16, 8), m) == "xla"
    assert choose(1 << 20, Topology(1, 8), m) == "a2a"


def test_explain_names_the_choice_and_all_candidates():
    text = explain(16 << 20, TWO_HOSTS, CostModel.p4d())
    assert "hierarchical" in text.split("<- chosen")[0].splitlines()[-1]
    for name in ["xla", "ring", "a2a", "hierarchical"]:
        assert name in text
    assert "ffi: not a candidate: no mesh axis given" in text


def test_scope_cost_model_changes_choice():
    slow_latency = CostModel(alpha_intra=1e-3, bw_intra=1e12, alpha_inter=1e-3, bw_inter=1e12)
    with collectives.scope(cost_model=slow_latency):
        assert choose(16 << 20, TWO_HOSTS) == "a2a"
    assert choose(16 << 20, TWO_HOSTS) == "xla"  # no calibration on CPU: xla


def _measured(**curves) -> CostModel:
    return CostModel(1e-6, 1e9, 1e-6, 1e9, source="test calibration", extrapolate=False,
                     measured={"all_gather": {"1x8": curves}})


def test_measured_curves_decide_per_size():
    model = _measured(xla=[(1024, 10e-6), (1 << 20, 1e-3)],
                      a2a=[(1024, 5e-6), (1 << 20, 4e-3)],
                      ring=[(1024, 50e-6), (1 << 20, 2e-3)])
    one_host = Topology(1, 8)
    assert choose(1024, one_host, model) == "a2a"
    assert choose(1 << 20, one_host, model) == "xla"
    assert choose(64 << 20, one_host, model) == "xla"  # past the table: linear in bytes
    d = decide(32 << 10, one_host, model)
    assert d.seconds["hierarchical"] is None and d.why == "test calibration"


def test_uncalibrated_topology_on_cpu_falls_back_to_xla_and_says_why():
    model = _measured(a2a=[(1024, 1e-6)])
    d = decide(1024, Topology(2, 4), model)
    assert d.pick == "xla"
    assert "topology 2x4 was not calibrated" in d.why and "does not extrapolate" in d.why


def test_without_calibration_cpu_uses_xla_and_gpu_public_constants(tmp_path):
    d = decide(1024, TWO_HOSTS)
    assert d.pick == "xla" and "no calibration at" in d.why and "auto uses xla" in d.why
    assert "auto uses xla" in explain(1024, TWO_HOSTS)
    from collectives.profile import default_model
    model, why = default_model("gpu")
    assert model == CostModel.p4d() and "public GPU constants" in why


def test_cached_calibration_is_used_for_this_host_and_backend():
    model = _measured(ring=[(1024, 1e-6)])
    model.save(cached_path("cpu"))
    d = decide(1024, Topology(1, 8))
    assert d.pick == "ring" and str(cached_path("cpu")) in d.why


def test_ffi_is_a_candidate_only_when_the_caller_says_it_can_run():
    model = CostModel.p4d()
    assert decide(1 << 20, Topology(2, 4), model).seconds.keys() == {
        "xla", "ring", "a2a", "hierarchical"}
    with_ffi = decide(1 << 20, Topology(2, 4), model, ffi=True)
    assert "ffi" in with_ffi.seconds
    # host staging makes ffi dearer than hierarchical under the GPU constants
    assert with_ffi.seconds["ffi"] > with_ffi.seconds["hierarchical"]


def test_explain_for_a_mesh_axis_says_why_ffi_cannot_run(monkeypatch):
    import jax
    mesh = jax.make_mesh((2, 4), ("dp", "sdp"))
    text = explain(1 << 20, mesh=mesh, axis_name="sdp")
    assert text.startswith("all_gather of 1048576 B per rank on 1 host(s) x 4 device(s)")
    assert "ffi: not a candidate: not an MPI job" in text
    monkeypatch.setenv("PMI_RANK", "0")
    monkeypatch.setenv("PMI_SIZE", "2")
    assert "ffi: not a candidate: JAX has 1 processes but MPI 2" in explain(
        1 << 20, mesh=mesh, axis_name="sdp")
    assert "no mesh in collectives.scope" in explain(1 << 20, Topology(2, 4), mesh=None,
                                                     axis_name="sdp")


def test_a_near_tie_goes_to_xla():
    one_host = Topology(1, 8)
    assert choose(1024, one_host, _measured(xla=[(1024, 1.04e-5)], a2a=[(1024, 1e-5)])) == "xla"
    assert choose(1024, one_host, _measured(xla=[(1024, 1.2e-5)], a2a=[(1024, 1e-5)])) == "a2a"
