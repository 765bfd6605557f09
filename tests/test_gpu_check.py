"""``bench/gpu_check.py``, the one-command GPU measurement, kept working on CPU: its
``--smoke`` run fills every section and writes its files; its pieces that need no run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.gpucheck import attention, gemms, kernels, planner, report, runner

ROOT = Path(__file__).resolve().parents[1]
# what a CPU cannot run, and says so in the row
CPU_SKIPS = ("cuDNN needs an NVIDIA GPU", "cuDNN's kernel takes no ALiBi slopes",
             "XLA:CPU drops host offloads")


@pytest.mark.slow
def test_smoke_run_fills_every_section_and_writes_markdown_and_json(tmp_path):
    results, out = tmp_path / "results", tmp_path / "out"
    # a generous budget: CI's cores are shared, and no row may be cut short here
    done = subprocess.run([sys.executable, "bench/gpu_check.py", "--smoke", "--budget", "900",
                           "--results-dir", str(results), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    for folder in (results, out):
        assert len(list(folder.glob("*-cpu-smoke.md"))) == 1
        assert len(list(folder.glob("*-cpu-smoke.json"))) == 1
    data = json.loads(next(results.glob("*.json")).read_text())["sections"]
    assert list(data) == [name for name, _ in runner.SECTIONS]
    for name, entry in data.items():
        rows = entry["rows"]
        assert any(r["status"] == "ok" for r in rows), name
        bad = [(r["label"], r["status"], r.get("reason")) for r in rows
               if r["status"] != "ok" and not any(s in r.get("reason", "") for s in CPU_SKIPS)]
        assert bad == [], name
    training = data["training"]["rows"]
    assert {r["contender"] for r in training} == {"jaxsmp", "jax.jit", "torch"}
    assert all(r["tokens_per_s"] > 0 and 0 < r["mfu"] for r in training)
    assert [r["fp8_gemms"] for r in data["fp8"]["rows"]] == [0, 0]  # XLA:CPU: no cuBLASLt
    assert len(data["planner"]["rows"]) == 8   # one per measured jaxsmp row
    assert {r["kind"] for r in data["gemms"]["rows"]} == set(gemms.KINDS)
    assert all(r["tflops"] > 0 for r in data["gemms"]["rows"])
    assert all(r["vs_bf16"] > 0 for r in data["gemms"]["rows"] if r["kind"] != "bf16")
    assert "### 1. Training throughput" in done.stdout


def test_rows_share_a_worker_on_cpu_and_get_one_each_when_isolated():
    rows = [{}, {}, {"env": {"A": "1"}}, {}]
    assert runner.groups(rows, isolate=False) == [[0, 1], [2], [3]]
    assert runner.groups(rows, isolate=True) == [[0], [1], [2], [3]]


def test_only_keeps_the_rows_whose_label_holds_one_of_its_texts():
    rows = [{"label": "llama 7b-width seq 2048 jaxsmp"}, {"label": "gpt_neox 1.3b seq 2048"},
            {"label": "gpt_neox 1.3b remat=full"}]
    assert runner.chosen("training", rows, ["llama"]) == rows[:1]
    assert runner.chosen("training", rows, ["jaxsmp", "remat="]) == [rows[0], rows[2]]
    assert runner.chosen("training", rows, None) == rows
    assert runner.chosen("environment", rows, ["llama"]) == rows
    assert runner.parse(["--only", "llama"]).only == ["llama"]
    assert runner.parse(["--only", "jaxsmp", "fp8"]).only == ["jaxsmp", "fp8"]


def test_attention_flops_follow_flash_attentions_causal_convention():
    row = {"batch": 1, "heads": 16, "seq": 2048, "head_dim": 128}
    assert attention.flops(row) == 3.5 * 4 * 16 * 2048 ** 2 * 128 / 2


def test_planner_plans_the_measured_gpu_or_says_it_cannot():
    assert planner.planner_gpu("NVIDIA H100 80GB HBM3") == ("H100-SXM", "")
    assert planner.planner_gpu("NVIDIA H200")[0] == "H200"
    assert planner.planner_gpu("NVIDIA H100 PCIe")[1].startswith("planned as SXM")
    gpu, why = planner.planner_gpu("NVIDIA L4")
    assert gpu is None and "L4" in why


def test_a_failed_or_skipped_row_shows_its_reason_in_the_table():
    entry = {"title": "2. Attention forward + backward", "budget_s": 10, "wall_s": 1.0,
             "rows": [{"impl": "cudnn", "status": "skipped", "reason": "cuDNN needs an NVIDIA GPU"},
                      {"impl": "pallas", "status": "error", "reason": "ValueError: bad"}]}
    text = report.section_table("attention", entry)
    assert "skipped: cuDNN needs an NVIDIA GPU" in text and "error: ValueError: bad" in text


def test_smoke_workers_serve_one_group_after_another_in_one_process(tmp_path):
    env = runner.worker_env(dict(os.environ), smoke=True, cache_dir=str(tmp_path))
    workers = runner.Workers(env, None, spare=False, reuse=True)
    ctx, results, pids = {"smoke": True}, [], []
    try:
        for _ in range(2):
            runner.run_group(workers, "environment", [{"label": "environment"}], ctx,
                             time.time() + 120, {}, lambda i, r: results.append(r))
            pids.append(workers.spare.proc.pid)
    finally:
        workers.close()
    assert [r["status"] for r in results] == ["ok", "ok"]
    assert pids[0] == pids[1]


def test_a_traced_kernel_is_matched_by_its_instruction_then_its_name_then_its_library():
    class Event:
        def __init__(self, name, stats=()):
            self.name, self.stats = name, list(stats)
    kinds = {"loop_add_fusion.3": "memory", "gemm_fusion_dot.1": "gemm"}
    kinds = {**kinds, **{k.replace(".", "_"): v for k, v in kinds.items()}}
    assert kernels.kind_of(Event("k", [("hlo_op", "while.2,gemm_fusion_dot.1")]), kinds) == "gemm"
    assert kernels.kind_of(Event("loop_add_fusion_3"), kinds) == "memory"
    assert kernels.kind_of(Event("nvjet_sm90_tst_256x128_64x4_TNT"), kinds) == "gemm"
    assert kernels.kind_of(Event("cudnn_generated_fort_native_sdpa_sm90"), kinds) == "attention"
    assert kernels.kind_of(Event("memcpy128"), kinds) == "copy"
    assert kernels.kind_of(Event("some_unknown_kernel"), kinds) is None
