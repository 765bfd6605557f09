"""Measure this machine's alpha-beta link parameters: ``python -m collectives.calibrate``.

Intra-host: a ppermute between two devices of one process. Inter-host: a ppermute
between two JAX processes on localhost (gloo over TCP). Each is a least-squares fit of
``time = alpha + bytes / bandwidth`` over message sizes; the result is saved as JSON
(default ``~/.cache/jaxsmp-collectives/cost_model.json``) for
``collectives.set_cost_model(CostModel.load(path))``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

SIZES = [1 << k for k in range(10, 25, 2)]  # 1 KiB .. 16 MiB
DEFAULT_OUT = Path.home() / ".cache" / "jaxsmp-collectives" / "cost_model.json"


def _measure(devices, reps: int) -> list[tuple[int, float]]:
    """(bytes, median seconds) of a 2-rank ppermute swap over ``devices``."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from collectives.timing import median_seconds

    mesh = Mesh(np.array(devices), ("x",))
    swap = jax.jit(jax.shard_map(lambda v: jax.lax.ppermute(v, "x", [(0, 1), (1, 0)]),
                                 mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    out = []
    for nbytes in SIZES:
        n = nbytes // 4
        x = jax.make_array_from_callback((2 * n,), NamedSharding(mesh, P("x")),
                                         lambda idx: np.ones(n, np.float32))
        out.append((nbytes, median_seconds(lambda: swap(x).block_until_ready(), reps)))
    return out


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares ``alpha, bandwidth`` of ``t = alpha + b / bandwidth`` (alpha >= 0)."""
    import numpy as np
    b = np.array([p[0] for p in points], float)
    t = np.array([p[1] for p in points], float)
    slope, alpha = np.polyfit(b, t, 1)
    return float(max(alpha, 0.0)), float(1.0 / max(slope, 1e-15))


def _worker(process_id: int, port: int, reps: int) -> None:
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id,
                               initialization_timeout=60)
    devices = sorted(jax.devices(), key=lambda d: d.process_index)
    points = _measure(devices, reps)
    if process_id == 0:
        print(json.dumps(points))


def calibrate(reps: int = 10, timeout: float = 600):
    """Measure and return a :class:`CostModel` for this machine."""
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    import jax

    from collectives.cost_model import CostModel
    from collectives.timing import launch

    intra = _measure(jax.devices()[:2], reps)
    outs = launch(lambda i, port: ["-m", "collectives.calibrate", "--worker", str(i), str(port),
                                   "--reps", str(reps)], 2, timeout)
    inter = [tuple(p) for p in json.loads(outs[0].strip().splitlines()[-1])]
    a_in, bw_in = fit(intra)
    a_x, bw_x = fit(inter)
    return CostModel(alpha_intra=a_in, bw_intra=bw_in, alpha_inter=a_x, bw_inter=bw_x,
                     source=f"calibrated on {os.uname().nodename}"), intra, inter


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--worker", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(*args.worker, args.reps)
    model, intra, inter = calibrate(args.reps)
    print(f"{'bytes':>10} {'intra us':>10} {'inter us':>10}")
    for (b, ti), (_, tx) in zip(intra, inter):
        print(f"{b:>10} {ti * 1e6:>10.1f} {tx * 1e6:>10.1f}")
    print(model)
    model.save(args.out)
    print(f"saved to {args.out}")


if __name__ == "__main__":
    sys.exit(main())
