import pytest

from collectives.calibrate import fit


def test_fit_recovers_alpha_and_bandwidth():
    points = [(b, 5e-6 + b / 2e9) for b in (1024, 65536, 1 << 20, 1 << 24)]
    alpha, bw = fit(points)
    assert alpha == pytest.approx(5e-6, rel=1e-3)
    assert bw == pytest.approx(2e9, rel=1e-6)


def test_fit_clamps_negative_latency():
    alpha, _ = fit([(1000, 1e-6), (2000, 3e-6)])
    assert alpha == 0.0
