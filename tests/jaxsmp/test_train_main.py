"""``python -m jaxsmp.train``: the shared trainer from the command line, and the configs
shipped in examples/configs/ (the CPU one trains; the GPU ones parse, and their mesh and
batch fit the GPUs they are written for)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxsmp.cli import parse_args

ROOT = Path(__file__).parents[2]
CONFIGS = ROOT / "examples" / "configs"
GPU_CONFIGS = ["gpt_neox_1.3b_8gpu.toml", "llama2_7b_4x8gpu.toml"]


@pytest.mark.parametrize("name", ["tiny_cpu.toml", "mixtral_tiny_cpu.toml"])
def test_the_tiny_cpu_config_trains(name):
    proc = subprocess.run(
        [sys.executable, "-m", "jaxsmp.train", "--config", str(CONFIGS / name),
         "--steps", "2", "--eval-every", "0", "--no-progress", "--print-losses"],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "\n  attention         reference (auto: cpu: " in proc.stdout  # step.explain
    losses = json.loads(proc.stdout.split("losses: ")[1])
    assert len(losses) == 2 and all(loss == loss for loss in losses)  # finite, not NaN


@pytest.mark.parametrize("name", GPU_CONFIGS)
def test_a_gpu_config_fits_its_gpus(name):
    cfg = parse_args(["--config", str(CONFIGS / name)])
    devices = cfg.dp * cfg.sdp * cfg.tp * cfg.pp * cfg.cp
    check = ("import sys; from jaxsmp.cli import parse_args; from jaxsmp.cli.build import "
             "run_mesh; print(run_mesh(parse_args(['--config', sys.argv[1]])).shape)")
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    proc = subprocess.run([sys.executable, "-c", check, str(CONFIGS / name)], env=env,
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"'sdp': {cfg.sdp}" in proc.stdout


def test_the_module_and_the_console_script_run_the_same_trainer():
    import tomllib
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"jaxsmp-train": "jaxsmp.cli.entry:main",
                       "jaxsmp-plan": "jaxsmp.plan.__main__:main"}
    main = (ROOT / "jaxsmp" / "train" / "__main__.py").read_text()
    assert "from jaxsmp.cli.entry import main" in main
