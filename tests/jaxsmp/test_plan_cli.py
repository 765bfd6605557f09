"""``python -m jaxsmp.plan``: the table, --json, --preflight and errors."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import jaxsmp
from conftest import require_gpu_compiler
from jaxsmp.hf import to_hf_config
from jaxsmp.plan.__main__ import main

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = {"dp", "sdp", "tp", "pp", "microbatch_size", "grad_accum", "remat", "offload",
            "memory_gib_per_gpu", "tflops_per_gpu", "mfu", "fits"}


def test_json_lists_the_plans_best_first(capsys):
    assert main(["--model", "gpt_neox:13b", "--node", "p4d.24xlarge", "--nodes", "4",
                 "--seq-len", "2048", "--global-batch", "64", "--top", "3", "--json"]) == 0
    plans = json.loads(capsys.readouterr().out)
    assert len(plans) == 3 and REQUIRED <= set(plans[0])
    assert all(p["fits"] for p in plans)
    assert [p["tflops_per_gpu"] for p in plans] == sorted(
        (p["tflops_per_gpu"] for p in plans), reverse=True)


def test_the_gradient_reduction_dtype_is_printed_and_can_be_chosen(capsys):
    common = ["--model", "gpt_neox:13b", "--node", "p4d.24xlarge", "--nodes", "4",
              "--seq-len", "2048", "--global-batch", "64", "--top", "1"]
    assert main(common) == 0
    assert "bf16, gradients reduced in bf16" in capsys.readouterr().out
    assert main(common + ["--reduce-dtype", "fp32", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["reduce_dtype"] == "fp32"
    with pytest.raises(SystemExit):
        main(common + ["--reduce-dtype", "fp16"])
    assert "invalid choice: 'fp16'" in capsys.readouterr().err


def test_a_hugging_face_config_and_a_generic_node_are_accepted(tmp_path, capsys):
    config = jaxsmp.models.preset("llama", "tiny")
    (tmp_path / "config.json").write_text(json.dumps(to_hf_config(config)))
    assert main(["--model", str(tmp_path / "config.json"), "--node", "8xH100-SXM+800Gbps",
                 "--seq-len", "256", "--global-batch", "16", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "Why #1" in out and "8xH100-SXM+800Gbps" in out


def test_bad_input_is_one_clear_line(capsys):
    assert main(["--model", "gpt_neox:13b", "--node", "p9.huge", "--seq-len", "2048",
                 "--global-batch", "64"]) == 2
    assert "unknown node type 'p9.huge'" in capsys.readouterr().err


@pytest.mark.slow
def test_preflight_compiles_the_best_plan_on_simulated_devices(capsys):
    assert main(["--model", "gpt_neox:tiny", "--node", "8xA100-80GB+400Gbps", "--seq-len",
                 "128", "--global-batch", "16", "--top", "1", "--remat", "full",
                 "--preflight", "--preflight-backend", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "pre-flight:" in out and "model vs compiled peak" in out


def test_preflight_compiles_the_best_plan_for_the_nodes_gpus(capsys):
    require_gpu_compiler()
    assert main(["--model", "gpt_neox:tiny", "--node", "p5.48xlarge", "--nodes", "2",
                 "--seq-len", "128", "--global-batch", "32", "--top", "1", "--preflight"]) == 0
    out = capsys.readouterr().out
    assert "pre-flight (XLA:GPU, deviceless):" in out and "16 x H100-SXM" in out
    assert ": fits" in out and "model vs compiled peak" in out
    # the step's time: the roofline over the compiled program and the analytic model
    assert "time (roofline over XLA:GPU's program)" in out and "time (analytic model)" in out
    # this process's JAX started without jaxsmp's GPU flags: the pre-flight says so
    from jaxsmp.plan.gpu_preflight import FLAGS_MISSING
    assert FLAGS_MISSING in out


@pytest.mark.slow
def test_the_cli_preflight_compiles_with_jaxsmps_gpu_flags_even_under_jax_platforms_cpu():
    """JAX_PLATFORMS=cpu keeps jaxsmp's import from adding its GPU overlap flags; the
    pre-flight adds them itself, so it compiles the program a GPU runs, with the combine
    thresholds the trainer gives it: one layer of the model."""
    require_gpu_compiler()
    from jaxsmp.plan.gpu_preflight import FLAGS_SET
    env = {k: v for k, v in os.environ.items() if not k.startswith("_JAXSMP")}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="")
    done = subprocess.run(
        [sys.executable, "-m", "jaxsmp.plan", "--model", "gpt_neox:tiny", "--node",
         "p5.48xlarge", "--nodes", "2", "--seq-len", "128", "--global-batch", "32", "--top",
         "1", "--preflight"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert FLAGS_SET in done.stdout and "model vs compiled peak" in done.stdout
    from jaxsmp.models import preset
    from jaxsmp.plan.workload import Workload
    layer = Workload(preset("gpt_neox", "tiny"), 128).layer_bytes("bf16")
    assert f"combined up to {layer:,} bytes" in done.stdout, done.stdout[-2000:]


def test_preflight_names_a_gpu_without_a_target(capsys, monkeypatch):
    from dataclasses import replace

    from jaxsmp.plan.hardware import GPUS
    monkeypatch.setitem(GPUS, "L40S", replace(GPUS["A100-40GB"], name="L40S"))
    assert main(["--model", "gpt_neox:tiny", "--node", "8xL40S+400Gbps", "--seq-len",
                 "128", "--global-batch", "16", "--top", "1", "--preflight"]) == 2
    assert "no GPU target" in capsys.readouterr().err


def test_python_dash_m_runs_the_package():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "jaxsmp.plan", "--model", "gpt_neox:tiny",
                           "--node", "p4d.24xlarge", "--seq-len", "128", "--global-batch",
                           "8", "--top", "1", "--json"], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert REQUIRED <= set(json.loads(done.stdout)[0])


def test_options_that_would_be_ignored_are_refused(capsys):
    with pytest.raises(SystemExit):
        main(["--model", "gpt_neox:tiny", "--node", "p4d.24xlarge", "--seq-len", "128",
              "--global-batch", "8", "--max-devices", "8"])
    assert "--max-devices applies to --preflight --preflight-backend cpu only" in (
        capsys.readouterr().err)
