"""The GPT-NeoX example trains on the bundled text: loss falls clearly."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from jaxsmp.cli import parse_args, run

ROOT = Path(__file__).parents[2]


def test_trainer_loss_falls():
    cfg = parse_args(["--steps", "40", "--eval-every", "40", "--no-progress", "--tp", "2",
                      "--microbatches", "2", "--seq-len", "64"])
    history = run(cfg)
    assert history.losses[-1] < history.losses[0] - 1.5  # 5.5 -> below 4 nats/byte
    assert history.eval_losses[40] < history.losses[0] - 1.5


def test_example_script_runs():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train_gpt_neox.py"), "--steps", "3",
         "--eval-every", "0", "--no-progress", "--print-losses", "--seq-len", "32"],
        capture_output=True, text=True, timeout=300, check=True).stdout
    losses = json.loads(out.split("losses: ")[1])
    assert len(losses) == 3 and losses[-1] < losses[0]


def test_unknown_preset_flag():
    with pytest.raises(ValueError, match="unknown gpt_neox preset 'nope'; valid: tiny"):
        run(parse_args(["--preset", "nope", "--steps", "1"]))


def ours(stderr: str) -> str:
    """``stderr`` without the lines JAX's CUDA plugin (installed by the test extra for the
    deviceless GPU compile) logs on import on a host with no GPU driver."""
    plugin = ("cudart_stub.cc", "All log messages before absl::InitializeLog()")
    return "\n".join(line for line in stderr.splitlines()
                     if not any(p in line for p in plugin)).strip()


def test_requiring_a_missing_checkpoint_prints_one_error_and_creates_nothing(tmp_path):
    missing = tmp_path / "runs" / "neox"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train_gpt_neox.py"), "--resume", "require",
         "--checkpoint-dir", str(missing)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert ours(proc.stderr) == (f"error: no checkpoint to resume: directory {missing} "
                                   f"does not exist")
    assert not (tmp_path / "runs").exists()


def test_a_bad_flag_fails_before_jax_starts():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train_gpt_neox.py"), "--steps", "-1"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and ours(proc.stderr) == "error: steps must be >= 1, got -1"
