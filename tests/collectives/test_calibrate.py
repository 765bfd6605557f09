import pytest

from collectives import Topology, choose
from collectives.calibrate import fit, model_from, run


def test_fit_recovers_alpha_and_bandwidth():
    points = [(b, 5e-6 + b / 2e9) for b in (1024, 65536, 1 << 20, 1 << 24)]
    alpha, bw = fit(points)
    assert alpha == pytest.approx(5e-6, rel=1e-3)
    assert bw == pytest.approx(2e9, rel=1e-6)


def test_fit_clamps_negative_latency():
    alpha, _ = fit([(1000, 1e-6), (2000, 3e-6)])
    assert alpha == 0.0


def test_measured_records_become_the_curves_auto_chooses_by():
    records = [{"op": "all_gather", "topo": "1x2", "algo": a, "bytes": b, "seconds": t}
               for a, b, t in [("ring", 1024, 2e-6), ("ring", 1 << 20, 1e-3),
                               ("xla", 1024, 1e-6), ("xla", 1 << 20, 2e-3)]]
    model = model_from(records, "cpu")
    assert not model.extrapolate and model.alpha_intra == pytest.approx(1e-6, rel=0.5)
    assert choose(1024, Topology(1, 2), model) == "xla"
    assert choose(1 << 20, Topology(1, 2), model) == "ring"
    assert choose(1024, Topology(2, 1), model) == "xla"  # not measured: xla on CPU


def test_a_worker_times_every_algorithm_of_a_topology():
    records = run(1, 2, ["1x2"], ops=["all_gather"], sizes=[1024], reps=1, timeout=240)
    assert {(r["topo"], r["algo"]) for r in records} == {
        ("1x2", a) for a in ("xla", "ring", "a2a", "hierarchical")}
    assert all(r["seconds"] > 0 for r in records)
