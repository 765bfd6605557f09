"""Run output: plain lines every --log-every steps when stdout is not a terminal, and
only from process 0 unless asked."""
import jax

from jaxsmp.cli import TrainConfig
from jaxsmp.cli.report import Reporter

VALUES = {"loss": 2.5, "tokens_per_second": 12345.0, "tflops_per_device": 0.01, "mfu": 0.05,
          "memory_bytes": 3 * 2 ** 30}


def test_plain_lines_every_log_every_steps_and_at_the_end(capsys):
    reporter = Reporter(TrainConfig(steps=7, log_every=3), first=0)
    assert reporter.bar is None  # pytest captures stdout: not a terminal
    for step in range(1, 8):
        reporter.step(step, VALUES)
    out = capsys.readouterr().out
    assert out.splitlines() == [
        f"step {s}/7 | loss 2.500 | tok/s 12,345 | TFLOP/s/dev 0.01 | MFU 5.0% | mem 3.00 GiB"
        for s in (3, 6, 7)]
    assert "\r" not in out


def test_other_processes_print_only_when_asked(capsys, monkeypatch):
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    Reporter(TrainConfig(log_every=1), first=0).step(1, VALUES)
    assert capsys.readouterr().out == ""
    Reporter(TrainConfig(log_every=1, log_all_processes=True), first=0).step(1, VALUES)
    assert capsys.readouterr().out.startswith("step 1/200 | loss 2.500")


def test_the_header_shows_what_the_step_runs_and_why(capsys):
    import numpy as np
    import optax

    import jaxsmp
    from jaxsmp.checkpoint import abstract_state
    from jaxsmp.losses import causal_lm_loss
    config = jaxsmp.models.preset("gpt_neox", "tiny", num_hidden_layers=1)
    state = abstract_state(config.build, optax.adamw(1e-4), jaxsmp.Mesh(sdp=8))
    batch = {"tokens": jax.ShapeDtypeStruct((8, 64), np.int32)}
    explanation = jaxsmp.step(causal_lm_loss, remat="full").explain(state, batch)
    Reporter(TrainConfig(), first=0).explain(explanation)
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["step (auto's choices with their reasons):"] + [
        "  " + line for line in str(explanation).splitlines()]
    assert lines[1].startswith("  attention         reference (auto: cpu: one float32 score")
    assert "  remat             full" in lines
