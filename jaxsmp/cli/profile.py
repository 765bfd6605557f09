"""``--profile-steps START:STOP``: a ``jax.profiler`` trace of those steps in
``LOG_DIR/profile`` (open it with TensorBoard's profile plugin, XProf or Perfetto)."""
from __future__ import annotations

import os
from pathlib import Path

import jax


class StepProfiler:
    """Starts the trace before the first step of ``steps`` and stops it (after the
    device work is done) after the last; ``steps=None`` traces nothing."""

    def __init__(self, steps: range | None, log_dir: str | os.PathLike | None):
        self.steps = steps
        self.directory = Path(log_dir) / "profile" if log_dir is not None else None
        self.active = False

    def before(self, step: int) -> None:
        """Before training step ``step`` (numbered from 1, as logged)."""
        if self.steps is not None and not self.active and step in self.steps:
            jax.profiler.start_trace(str(self.directory), create_perfetto_trace=True)
            self.active = True

    def after(self, step: int, outputs) -> None:
        """After step ``step``; ``outputs`` are waited for before the trace stops."""
        if self.active and step + 1 >= self.steps.stop:
            self.stop(outputs)

    def stop(self, outputs=None) -> None:
        if self.active:
            jax.block_until_ready(outputs)
            jax.profiler.stop_trace()
            self.active = False
