"""The planner against jaxsmp's own step as a GPU ran it (``bench/plan_vs_measured.py``:
the rows ``bench/gpu_check.py`` stored in ``bench/results``, none of them fitted)."""
import pytest

from conftest import bench_module, require_gpu_compiler


@pytest.fixture(scope="module")
def bench():
    return bench_module("plan_vs_measured")


@pytest.fixture(scope="module")
def rows(bench):
    return bench.measured_rows()


H100, H200 = "H100-SXM", "H200"
# rows the planner misses by more than 10%, and why (bench/results: what the H100's step
# traced shows, 2026-11-28-nvidia-h100-kernels; docs/planner.md, "Where the step's time
# goes")
KNOWN_MISSES = {
    ("training: bloom 1b7 (24 of 24 layers) seq 2048 jaxsmp", H100):
        "-10.4%: Pallas' FlashAttention is priced at FlashAttention-2's share of peak x "
        "0.71 (the slowest traced attention, cuDNN's in Llama's step); BLOOM's Pallas "
        "kernel traced at 0.90 x that share",
    ("training: bloom 1b7 (24 of 24 layers) seq 4096 jaxsmp", H100):
        "-13.7%: the same, with more of the step in attention at 4096 tokens",
    ("fp8: gpt_neox 1.3b fp8", H200):
        "+10.3%: the H200's 1.43x HBM bandwidth speeds fp8's quantisation traffic in the "
        "model; measured, its fp8 step is 2.4% faster than the H100's (-4.8% there)",
}


def test_every_stored_jaxsmp_row_is_read_and_a_rerun_replaces_the_first_timing(rows):
    keys = [(r.label, r.gpu) for r in rows]
    assert len(rows) >= 20 and len(set(keys)) == len(keys)
    assert {r.gpu for r in rows} == {H100, H200}
    llama = next(r for r in rows if r.label.startswith("training: llama") and "2048" in r.label
                 and r.gpu == H200)
    # timed again after one-device steps stopped double-buffering the layer loop
    assert llama.source.endswith("llama-rerun.json") and llama.seconds == pytest.approx(
        0.4446, abs=1e-4)


def _checked(rows):
    # offload is left out: its host-link rate (hardware.PCIE_GEN5) was derived from it
    return [r for r in rows if r.candidate.remat != "offload"]


def test_the_planner_predicts_jaxsmps_measured_steps_within_10_percent(bench, rows):
    errors = {(r.label, r.gpu): bench.error(r) for r in _checked(rows)
              if (r.label, r.gpu) not in KNOWN_MISSES}
    assert len(errors) >= 15
    assert {k[1] for k in errors} == {H100, H200}
    # fp8 on the H100 among them; BLOOM's two rows (Pallas attention) are known misses
    assert any("fp8" in k[0] for k in errors)
    assert all(abs(e) <= 0.10 for e in errors.values()), errors


@pytest.mark.xfail(strict=True, reason="; ".join(f"{k[0]} on {k[1]}: {v}"
                                                 for k, v in KNOWN_MISSES.items()))
def test_the_planner_predicts_the_rows_it_misses_within_10_percent(bench, rows):
    missed = [r for r in _checked(rows) if (r.label, r.gpu) in KNOWN_MISSES]
    assert len(missed) == len(KNOWN_MISSES)
    assert all(abs(bench.error(r)) <= 0.10 for r in missed)


def test_the_traced_steps_are_read_beside_the_planners_split_of_them(bench, rows):
    traced = bench.traced_rows()
    assert len(traced) == 6 and {t.gpu for t in traced} == {H100}
    neox = next(t for t in traced if t.label.startswith("gpt_neox 1.3b x24 seq 2048 remat=none "
                                                          "bf16"))
    # docs/planner.md, "Where the step's time goes": step, GEMMs, attention, the rest
    assert neox.traced == pytest.approx((0.316, 0.170, 0.031, 0.114), abs=6e-4)
    assert neox.planned == pytest.approx((0.319, 0.181, 0.032, 0.106), abs=6e-4)
    for t in traced:
        assert sum(t.planned[1:]) == pytest.approx(t.planned[0])
        assert min(t.planned) > 0


@pytest.mark.slow
def test_a_layers_memory_bound_work_per_remat_policy_is_as_the_docs_say(bench):
    """docs/planner.md ("Memory-bound work as the trace shows it"): per layer of
    GPT-NeoX 1.3b at 8 x 2048 tokens on one H100, compiled 4.56 ms with remat none and
    3.70 with full (recomputing adds no memory-bound pass; keeping the residuals copies
    them), planned 3.63 and 2.93."""
    require_gpu_compiler()
    (none, planned_none), (full, planned_full) = map(bench.layer_memory, ("none", "full"))
    assert none * 1e3 == pytest.approx(4.56, rel=0.03)
    assert full * 1e3 == pytest.approx(3.70, rel=0.03)
    assert (planned_none * 1e3, planned_full * 1e3) == pytest.approx((3.63, 2.93), abs=0.006)


def test_the_planners_kernel_rates_are_the_slowest_traced_rows(bench):
    """jaxsmp.plan.calibration.FITTED's matmul and attention: per traced H100 step, the
    planner's GEMM and attention seconds at 1 over the traced ones; the slowest row's,
    rounded down to two places (``plan_vs_measured.py --rates``)."""
    import math

    from jaxsmp.plan.calibration import FITTED
    rates = bench.traced_rates()
    assert len(rates) == 6
    assert FITTED.matmul == math.floor(100 * min(r[1] for r in rates)) / 100 == 0.90
    assert FITTED.attention == math.floor(100 * min(r[2] for r in rates)) / 100 == 0.71
    # every traced row at or above those rates: the planner never prices a kernel faster
    assert all(g >= FITTED.matmul and a >= FITTED.attention for _, g, a in rates)
