"""What a run shows: a progress bar on a terminal, one plain line every ``log_every``
steps otherwise (cluster jobs, CI); only process 0 prints unless asked."""
from __future__ import annotations

import sys
from dataclasses import dataclass

import jax
import numpy as np
from tqdm import tqdm

from jaxsmp.cli.config import TrainConfig
from jaxsmp.metrics.memory import device_memory_in_use
from jaxsmp.train.batch import to_host


@dataclass(frozen=True)
class Throughput:
    """What converts a step's time into tokens/s, TFLOP/s per device and MFU."""
    tokens_per_step: int
    flops_per_token: float
    devices: int
    peak_flops: float  # per device


def step_values(metrics: dict, seconds: float, rate: Throughput) -> dict[str, float | None]:
    """The numbers logged for one training step (None where not measured)."""
    get = lambda k: float(to_host(metrics[k])) if k in metrics else None
    tokens_per_second = rate.tokens_per_step / seconds
    flops = tokens_per_second * rate.flops_per_token / rate.devices
    values = {"loss": get("loss"), "learning_rate": get("learning_rate"),
              "grad_norm": get("grad_norm"), "loss_scale": get("loss_scale"),
              "tokens_per_second": tokens_per_second, "tflops_per_device": flops / 1e12,
              "mfu": flops / rate.peak_flops, "step_seconds": seconds,
              "memory_bytes": device_memory_in_use()}
    # the loss function's own scalars (a mixture of experts': lm_loss, aux_loss, ...)
    return {**values, **{k: get(k) for k in sorted(LOSS_METRICS) if k in metrics}}


LOSS_METRICS = ("lm_loss", "aux_loss", "z_loss", "dropped_tokens")
HISTOGRAM_METRICS = ("expert_load",)  # [layers, experts]: one histogram per layer


def histogram_values(metrics: dict) -> dict[str, np.ndarray]:
    """The step's per-layer histograms (:data:`HISTOGRAM_METRICS`) as host arrays."""
    return {k: np.asarray(to_host(metrics[k])) for k in HISTOGRAM_METRICS if k in metrics}


def _memory(values: dict) -> str:
    used = values.get("memory_bytes")
    return "n/a" if used is None else f"{used / 2 ** 30:.2f} GiB"


def summary(values: dict) -> dict[str, str]:
    return {"loss": f"{values['loss']:.3f}", "tok/s": f"{values['tokens_per_second']:,.0f}",
            "TFLOP/s/dev": f"{values['tflops_per_device']:.3g}",
            "MFU": f"{100 * values['mfu']:.1f}%", "mem": _memory(values)}


class Reporter:
    """Prints the run's header, its steps and its evaluations."""

    def __init__(self, cfg: TrainConfig, first: int):
        self.cfg = cfg
        self.enabled = jax.process_index() == 0 or cfg.log_all_processes
        several = jax.process_count() > 1 and cfg.log_all_processes
        self.prefix = f"[process {jax.process_index()}] " if several else ""
        tty = sys.stdout.isatty()
        self.bar = None
        if self.enabled and cfg.progress and tty:
            self.bar = tqdm(total=cfg.steps, initial=first, dynamic_ncols=True, file=sys.stdout)

    def print(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(self.prefix + text)
        else:
            print(self.prefix + text, flush=True)

    def explain(self, explanation) -> None:
        """The header's account of what the step runs and why (``step.explain``)."""
        self.print("step (auto's choices with their reasons):")
        for line in str(explanation).splitlines():
            self.print("  " + line)

    def step(self, step: int, values: dict) -> None:
        """After step ``step`` (1-based count of steps done)."""
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(summary(values))
        elif self.cfg.progress and (step % self.cfg.log_every == 0 or step == self.cfg.steps):
            self.print(f"step {step}/{self.cfg.steps} | "
                       + " | ".join(f"{k} {v}" for k, v in summary(values).items()))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
