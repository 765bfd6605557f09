"""The command-line entry point the example scripts share."""
from __future__ import annotations

import faulthandler
import json
import signal
import sys

import jax

from jaxsmp import distributed, xla_flags
from jaxsmp.checkpoint import CheckpointError
from jaxsmp.cli.config import ConfigError
from jaxsmp.cli.flags import parse_args
from jaxsmp.cli.loop import run
from jaxsmp.cli.preemption import PREEMPTED_EXIT_CODE, Preempted
from jaxsmp.simulated_devices import simulate_cpu_devices


def _layer_bytes(cfg) -> int:
    """One stacked layer's parameters in the compute dtype (abstract: no backend)."""
    from jaxsmp.models import preset
    from jaxsmp.plan.workload import Workload
    return Workload(preset(cfg.model, cfg.preset), cfg.seq_len).layer_bytes(cfg.step.precision)


def _join_cluster(cfg) -> None:
    """Joins the cluster the launcher's environment describes, or simulates
    ``--simulate-devices`` CPU devices for one process. A launch that cannot train (its
    processes' devices do not fit the mesh, a taken port, ...) exits with status 2."""
    try:
        if distributed.cluster_from_env() is None:
            simulate_cpu_devices(cfg.simulate_devices)  # before JAX starts; ignored on GPU/TPU
            return
        spec = distributed.initialize()
        distributed.check_mesh_fits(spec, {a: getattr(cfg, a) for a in ("dp", "ep", "sdp", "tp",
                                                                         "pp", "cp")})
    except (ValueError, distributed.LaunchError) as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)


def _stacks_on_request() -> None:
    """``kill -USR2 <pid>`` prints every thread's Python stack to stderr and training goes
    on: where a hung worker of a cluster job waits (not SIGUSR1, which SLURM's
    ``--signal`` often sends)."""
    stderr = sys.__stderr__   # the process's own: sys.stderr may be a capture, no file
    if hasattr(signal, "SIGUSR2") and stderr is not None:
        faulthandler.register(signal.SIGUSR2, file=stderr, all_threads=True)


def main(argv: list[str] | None = None, **defaults) -> None:
    """Parses flags (and ``--config``) over ``defaults`` (an example script's, e.g.
    ``model="bloom"``), joins the cluster described by the environment (or simulates
    ``--simulate-devices`` CPU devices for a single process), trains, and prints the
    losses (process 0). Exits with status 2 on a bad setting, 1 on a checkpoint problem
    and :data:`PREEMPTED_EXIT_CODE` after a stop signal; SIGUSR2 prints its stacks."""
    _stacks_on_request()
    try:
        cfg = parse_args(argv, **defaults)
    except ConfigError as err:  # before any device work or compilation
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    if xla_flags.wanted():  # on a GPU: combine thresholds of one layer
        xla_flags.apply(_layer_bytes(cfg))
    _join_cluster(cfg)
    try:
        history = run(cfg)
    except ConfigError as err:  # a setting that does not fit the devices or the data
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except CheckpointError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    except Preempted as stop:
        print(f"{stop}; run the same command again to resume", flush=True)
        sys.exit(PREEMPTED_EXIT_CODE)
    if jax.process_index() != 0:
        return
    if not history.losses:
        print(f"nothing to train: the checkpoint is at step {history.start_step} and "
              f"--steps is {cfg.steps}")
        return
    print(f"loss: first {history.losses[0]:.3f} -> last {history.losses[-1]:.3f}")
    if history.plot:
        print(f"metrics in {cfg.log_dir}; loss curves plotted to {history.plot}")
    if cfg.print_losses:
        print("losses: " + json.dumps(history.losses))
