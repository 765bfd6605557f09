"""A stop signal finishes the step, saves a checkpoint and exits with a distinct code;
the same command then resumes with the uninterrupted run's losses."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from jaxsmp.cli import PREEMPTED_EXIT_CODE, TrainConfig, run
from jaxsmp.cli.preemption import StopSignals
from jaxsmp.metrics.logger import read_metrics

ROOT = Path(__file__).parents[2]
SETTINGS = dict(steps=16, batch_size=8, seq_len=32, eval_every=0)


def _command(tmp_path) -> list[str]:
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in SETTINGS.items()]
    return [sys.executable, str(ROOT / "examples" / "train_gpt_neox.py"), *flags,
            "--log-every=1", f"--checkpoint-dir={tmp_path / 'ckpt'}",
            f"--log-dir={tmp_path / 'logs'}", "--print-losses"]


@pytest.mark.slow
def test_sigterm_saves_exits_75_and_the_same_command_resumes_exactly(tmp_path):
    command = _command(tmp_path)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:  # stdout is a pipe: plain lines, no progress bar
        lines.append(line)
        if line.startswith("step 3/16 |"):
            proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=300) == PREEMPTED_EXIT_CODE, "".join(lines[-30:])
    stopped = next(line for line in lines if "stopped by SIGTERM" in line)
    step = int(stopped.split("after step ")[1].split(" ")[0])
    assert 3 <= step < 16 and "checkpoint saved" in stopped and "\r" not in "".join(lines)
    assert (tmp_path / "ckpt" / str(step)).is_dir()

    resumed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    losses = json.loads(resumed.stdout.split("losses: ")[1])
    assert len(losses) == 16 - step
    whole = run(TrainConfig(**SETTINGS, progress=False))  # same XLA_FLAGS as the children
    assert losses == whole.losses[step:]  # bitwise: same batches, same state
    logged = [r["loss"] for r in read_metrics(tmp_path / "logs") if r["split"] == "train"]
    assert logged == whole.losses


@pytest.mark.slow
def test_sigusr2_prints_every_stack_and_training_goes_on(tmp_path):
    proc = subprocess.Popen(_command(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("step 2/16 |"):
            proc.send_signal(signal.SIGUSR2)
    out = "".join(lines)
    assert proc.wait(timeout=300) == 0, out[-3000:]  # SIGUSR2's default action ends it
    dump = out[out.index("step 2/16 |"):]
    assert "most recent call first" in dump and 'File "' in dump, out[-3000:]
    assert "step 16/16 |" in dump


def test_sigint_is_caught_once_and_the_second_one_interrupts():
    before = signal.getsignal(signal.SIGINT)
    with StopSignals() as signals:
        assert not signals.requested(1)
        os.kill(os.getpid(), signal.SIGINT)
        assert signals.requested(2) and signals.received == "SIGINT"
        assert signal.getsignal(signal.SIGINT) is before  # the next one interrupts at once
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@pytest.mark.slow
def test_sigterm_to_the_launcher_stops_both_processes_after_the_same_step(tmp_path):
    """Through JAX's preemption service: both processes save one checkpoint and exit
    75; the same command resumes with the single-process run's losses."""
    mesh = ["--dp=2", "--sdp=4"]
    command = [sys.executable, "-m", "jaxsmp.launch", "--hosts", "2", "--devices-per-host", "4",
               "--timeout", "600", *_command(tmp_path)[1:], *mesh]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("[0] step 3/16 |"):
            proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=600) == PREEMPTED_EXIT_CODE, "".join(lines[-30:])
    stops = {line[:4]: line for line in lines if "stopped by SIGTERM" in line}
    assert set(stops) == {"[0] ", "[1] "}
    step = int(stops["[0] "].split("after step ")[1].split(" ")[0])
    assert f"after step {step} " in stops["[1] "] and step < 16

    resumed = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    losses = json.loads(resumed.stdout.split("losses: ")[1].splitlines()[0])
    whole = run(TrainConfig(**SETTINGS, dp=2, sdp=4, progress=False))
    assert losses == pytest.approx(whole.losses[step:], rel=1e-5)
