"""The command-line entry point the example scripts share."""
from __future__ import annotations

import json

import jax

from jaxsmp import distributed
from jaxsmp.simulated_devices import simulate_cpu_devices
from jaxsmp.cli.config import parse_args
from jaxsmp.cli.loop import run


def main(argv: list[str] | None = None, *, model: str) -> None:
    """Parses flags, joins the cluster described by the environment (or simulates
    ``--simulate-devices`` CPU devices for a single process), trains, and prints the
    losses (process 0)."""
    cfg = parse_args(argv, model=model)
    if distributed.cluster_from_env() is not None:
        distributed.initialize()
    else:
        simulate_cpu_devices(cfg.simulate_devices)  # before JAX starts; ignored on GPU/TPU
    history = run(cfg)
    if jax.process_index() == 0:
        print(f"loss: first {history.losses[0]:.3f} -> last {history.losses[-1]:.3f}")
        if cfg.print_losses:
            print("losses: " + json.dumps(history.losses))
