"""The planner against jaxsmp's own step as a GPU ran it (``bench/plan_vs_measured.py``:
the rows ``bench/gpu_check.py`` stored in ``bench/results``, none of them fitted)."""
import pytest

from conftest import bench_module


@pytest.fixture(scope="module")
def bench():
    return bench_module("plan_vs_measured")


@pytest.fixture(scope="module")
def rows(bench):
    return bench.measured_rows()


def test_every_stored_jaxsmp_row_is_read_and_a_rerun_replaces_the_first_timing(rows):
    labels = [r.label for r in rows]
    assert len(rows) >= 10 and len(set(labels)) == len(labels)
    llama = next(r for r in rows if r.label.startswith("training: llama") and "2048" in r.label)
    # timed again after one-device steps stopped double-buffering the layer loop
    assert llama.source.endswith("llama-rerun.json") and llama.seconds == pytest.approx(
        0.4446, abs=1e-4)


def test_the_planner_predicts_jaxsmps_measured_bf16_steps_within_10_percent(bench, rows):
    # offload is left out: its host-link rate (hardware.PCIE_GEN5) was derived from it
    checked = [r for r in rows if r.candidate.precision == "bf16"
               and r.candidate.remat != "offload"]
    errors = {r.label: bench.error(r) for r in checked}
    assert len(errors) >= 8
    assert all(abs(e) <= 0.10 for e in errors.values()), errors


@pytest.mark.xfail(strict=True, reason="the planner's fp8 step is 13% faster than the "
                   "measured one: its float8 GEMMs are priced at twice bf16's achieved rate "
                   "(no FP8 GEMM rate measured; the compiled roofline does the same)")
def test_the_planner_predicts_jaxsmps_measured_fp8_step_within_10_percent(bench, rows):
    fp8 = [r for r in rows if r.candidate.precision == "fp8"]
    assert fp8 and all(abs(bench.error(r)) <= 0.10 for r in fp8)
