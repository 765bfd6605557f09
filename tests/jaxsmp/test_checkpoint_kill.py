"""The training loop with checkpoints: a save SIGKILLed partway leaves the previous
checkpoint loadable, and the next run resumes from it with the same losses."""
from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
from pathlib import Path

from jaxsmp.checkpoint import CheckpointManager
from jaxsmp.cli import TrainConfig, run
from jaxsmp.cli.config import flat

WORKER = Path(__file__).with_name("checkpoint_kill_worker.py")
CFG = TrainConfig(preset="tiny", batch_size=8, seq_len=32, steps=6, eval_every=0,
                  progress=False, save_every=2, keep=3)


def test_killed_save_keeps_previous_checkpoint_and_run_resumes(tmp_path):
    directory = tmp_path / "ckpt"
    cfg = dataclasses.replace(CFG, checkpoint_dir=str(directory))
    proc = subprocess.run(
        [sys.executable, str(WORKER), json.dumps(flat(cfg)), "4"],
        capture_output=True, text=True, timeout=600)  # same XLA flags: bitwise equal runs
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr[-3000:]
    assert "KILLING during commit" in proc.stdout
    names = sorted(p.name for p in directory.iterdir())
    assert "2" in names and "4" not in names, names
    assert any(n.startswith("4.orbax-checkpoint-tmp") for n in names), names  # half-written

    with CheckpointManager(directory) as ckpt:  # the half-written step is ignored
        assert ckpt.all_steps() == [2]
        assert ckpt.metadata()["step"] == 2

    resumed = run(cfg)
    assert resumed.start_step == 2
    uninterrupted = run(CFG)
    assert resumed.losses == uninterrupted.losses[2:]  # bitwise, same mesh
    assert sorted(p.name for p in directory.iterdir()) == ["2", "4", "6", "config.toml"]


def test_resume_required_without_checkpoint(tmp_path):
    cfg = dataclasses.replace(CFG, checkpoint_dir=str(tmp_path), resume="require")
    try:
        run(cfg)
    except FileNotFoundError as err:
        assert "no complete checkpoint" in str(err)
    else:
        raise AssertionError("resume='require' on an empty directory must fail")
