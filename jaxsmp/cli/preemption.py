"""A clean stop on preemption: SIGTERM or SIGINT asks the loop to finish the current
step, write a checkpoint and exit with :data:`PREEMPTED_EXIT_CODE`; the same command
then resumes exactly.

One process installs its own handlers (a second SIGINT interrupts at once). With
several processes, all must stop after the same step, so the loop asks JAX's
preemption service instead (``multihost_utils.reached_preemption_sync_point``),
which hears SIGTERM on any host and agrees on the step."""
from __future__ import annotations

import signal
import threading

import jax
from jax.experimental import multihost_utils

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: "try again later"; the restart resumes


class Preempted(Exception):
    """The run stopped early on a signal, after saving a checkpoint at ``step``."""

    def __init__(self, step: int, signal_name: str, saved: bool):
        self.step, self.signal_name, self.saved = step, signal_name, saved
        where = "checkpoint saved" if saved else "no --checkpoint-dir, nothing saved"
        super().__init__(f"stopped by {signal_name} after step {step} ({where})")


class StopSignals:
    """Context manager: ``requested(step)`` says whether to stop after ``step``."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.received: str | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name
        signal.signal(signal.SIGINT, self._previous.get(signal.SIGINT, signal.SIG_DFL))

    def __enter__(self) -> StopSignals:
        if jax.process_count() == 1 and threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def requested(self, step: int) -> bool:
        """Whether to stop after ``step`` (every process must call this every step)."""
        if jax.process_count() > 1 and multihost_utils.reached_preemption_sync_point(step):
            self.received = "SIGTERM"
        return self.received is not None
