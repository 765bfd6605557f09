"""Measure this machine's collectives: ``python -m collectives.calibrate``.

Times every algorithm's all_gather and reduce_scatter (1 KiB .. 16 MiB per rank) on the
topologies this machine can form: one process with 2, 4 and 8 devices and, on CPU, 2
processes x 1/2/4 devices and 4 processes x 1/2 devices (under mpiexec when it is there, so
``ffi`` is measured too; else as local processes over gloo). The contenders of one size
are timed in alternation and the medians kept. The result, a :class:`CostModel` with the
measured curves plus an alpha-beta fit of a two-device ppermute (within a process, and
across two processes), is saved where ``auto`` looks for it
(:func:`collectives.profile.cached_path`) or to ``--out``. About 10-20 minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ALGOS = ["xla", "ring", "a2a", "hierarchical"]
OPS = ["all_gather", "reduce_scatter"]
SIZES = [1 << k for k in range(10, 25, 2)]  # 1 KiB .. 16 MiB
# (processes, devices per process, topologies "HxG" measured in that launch)
LAUNCHES = [(1, 8, ["1x2", "1x4", "1x8"]), (2, 4, ["2x1", "2x2", "2x4"]), (4, 2, ["4x1", "4x2"])]


def _reps(nbytes: int, reps: int) -> int:
    return reps if nbytes <= 1 << 20 else max(3, reps // 2)


def _mesh(spec: str):
    """``HxG``: the first G devices of each process, axis ``x``; or a mesh like
    ``dp=2,sdp=4`` over all devices in jaxsmp's axis order, collective over ``sdp``."""
    import jax
    import numpy as np
    from jax.sharding import Mesh
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    if "=" in spec:
        sizes = dict(kv.split("=") for kv in spec.split(","))
        names = tuple(a for a in ("dp", "pp", "sdp", "tp") if a in sizes)
        grid = np.array(devices).reshape(tuple(int(sizes[a]) for a in names))
        return Mesh(grid, names), "sdp"
    hosts, per_host = map(int, spec.split("x"))
    chosen = [d for d in devices if sum(e.process_index == d.process_index and e.id < d.id
                                        for e in devices) < per_host]
    if len(chosen) != hosts * per_host:
        raise ValueError(f"topology {spec} does not fit {jax.process_count()} processes x "
                         f"{len(jax.local_devices())} devices")
    return Mesh(np.array(chosen), ("x",)), "x"


def _timed(mesh, axis: str, algo: str, op: str, nbytes: int):
    """A jitted collective over ``axis`` of ``mesh`` and its input (float32, ``nbytes`` per
    rank: the all-gather's input, the reduce-scatter's output)."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import collectives
    spec = P(tuple(mesh.axis_names))
    n = nbytes // 4 * (mesh.shape[axis] if op == "reduce_scatter" else 1)
    x = jax.make_array_from_callback((mesh.size * n,), NamedSharding(mesh, spec),
                                     lambda idx: np.ones(n, np.float32))
    fn = getattr(collectives, op)
    with collectives.scope(mesh=mesh):
        f = jax.jit(jax.shard_map(lambda v: fn(v, axis, algorithm=algo), mesh=mesh,
                                  in_specs=spec, out_specs=spec)).lower(x).compile()
    return f, x


def measure(mesh, axis: str, algos: list[str], ops: list[str], sizes: list[int],
            reps: int) -> list[dict]:
    """Median seconds per (op, size, algorithm); the algorithms of one size alternate."""
    import statistics
    import time

    from collectives.topology import Topology
    topo = Topology.for_mesh_axis(mesh, axis)
    out = []
    for op in ops:
        for nbytes in sizes:
            runs = {a: _timed(mesh, axis, a, op, nbytes) for a in algos}
            times: dict[str, list[float]] = {a: [] for a in algos}
            for r in range(_reps(nbytes, reps) + 1):  # round 0 warms up
                for a, (f, x) in runs.items():
                    start = time.perf_counter()
                    f(x).block_until_ready()
                    if r:
                        times[a].append(time.perf_counter() - start)
            out += [{"op": op, "bytes": nbytes, "algo": a,
                     "topo": f"{topo.hosts}x{topo.devices_per_host}",
                     "seconds": statistics.median(t)} for a, t in times.items()]
            del runs
    return out


def _worker(args) -> None:
    if args.devices:  # simulated CPU devices; 0: the platform's own (GPUs)
        os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
        os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    nproc = args.processes
    pid = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", args.pid)))
    if nproc > 1:
        if args.mpi:
            from collectives.ffi import ops  # noqa: F401  (MPI before JAX's runtime)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(f"127.0.0.1:{args.port}", num_processes=nproc,
                                   process_id=pid, initialization_timeout=120)
    results = []
    for spec in args.specs:
        mesh, axis = _mesh(spec)
        algos = args.algos + (["ffi"] if args.mpi and nproc > 1 else [])
        for r in measure(mesh, axis, algos, args.ops, args.sizes, args.reps):
            results.append({**r, "spec": spec})
        if pid == 0:
            print(f"measured {spec}", file=sys.stderr, flush=True)
    if pid == 0:
        print("RESULTS " + json.dumps(results), flush=True)


def run(processes: int, devices: int, specs: list[str], *, ops: list[str] = OPS,
        sizes: list[int] = SIZES, reps: int = 7, mpi: bool | None = None,
        algos: list[str] = ALGOS, timeout: float = 7200) -> list[dict]:
    """Measure ``specs`` in ``processes`` processes of ``devices`` CPU devices each, under
    mpiexec (``ffi`` included) when ``mpi`` (default: when mpiexec and MPI are there)."""
    from collectives.ffi.build import BuildError, find_mpi, find_mpiexec
    from collectives.timing import free_port, launch
    if mpi is None:
        try:
            mpi = processes > 1 and find_mpiexec() is not None and bool(find_mpi())
        except BuildError:
            mpi = False
    argv = ["-m", "collectives.calibrate", "--worker", "--processes", str(processes),
            "--devices", str(devices), "--reps", str(reps), "--ops", *ops,
            "--algos", *algos, "--sizes", *map(str, sizes), "--specs", *specs]
    if mpi:
        env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
        command = [find_mpiexec(), "-n", str(processes), sys.executable, *argv, "--mpi",
                   "--port", str(free_port())]
        done = subprocess.run(command, stdout=subprocess.PIPE, text=True, timeout=timeout,
                              env=env)
        if done.returncode:
            raise RuntimeError(f"{' '.join(command)} exited with {done.returncode}")
        out = done.stdout
    else:
        out = launch(lambda i, port: [*argv, "--pid", str(i), "--port", str(port)], processes,
                     timeout)[0]
    line = next(l for l in out.splitlines() if l.startswith("RESULTS "))
    return json.loads(line[len("RESULTS "):])


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares ``alpha, bandwidth`` of ``t = alpha + b / bandwidth`` (alpha >= 0)."""
    import numpy as np
    b = np.array([p[0] for p in points], float)
    t = np.array([p[1] for p in points], float)
    slope, alpha = np.polyfit(b, t, 1)
    return float(max(alpha, 0.0)), float(1.0 / max(slope, 1e-15))


def _link(records: list[dict], topo: str) -> tuple[float, float]:
    """Alpha-beta fit of the ring all-gather on a 2-rank topology (one ppermute)."""
    return fit([(r["bytes"], r["seconds"]) for r in records
                if r["topo"] == topo and r["algo"] == "ring" and r["op"] == "all_gather"])


def calibrate(reps: int = 7, launches=None):
    """Measure this machine into a CostModel. CPU: every launch of :data:`LAUNCHES`; GPU:
    one process over 2, 4, 8 of its GPUs (across nodes the alpha-beta model extrapolates,
    with public constants for the network)."""
    import jax
    backend = jax.default_backend()
    if launches is None:
        local = jax.local_device_count()
        launches = LAUNCHES if backend == "cpu" else [
            (1, 0, [f"1x{g}" for g in (2, 4, 8) if g <= local])]
    records = []
    for processes, devices, specs in launches:
        print(f"timing {processes} process(es) x {devices or 'all'} device(s): {specs}",
              file=sys.stderr)
        records += run(processes, devices, specs, reps=reps)
    return model_from(records, backend), records


def model_from(records: list[dict], backend: str):
    """The CostModel of measured records (``op``, ``topo``, ``algo``, ``bytes``, ``seconds``)."""
    import socket

    from collectives.cost_model import CostModel
    measured: dict = {}
    for r in records:
        measured.setdefault(r["op"], {}).setdefault(r["topo"], {}).setdefault(
            r["algo"], []).append((r["bytes"], r["seconds"]))
    public = CostModel.p4d()
    topos = {r["topo"] for r in records}
    a_in, bw_in = _link(records, "1x2") if "1x2" in topos else (public.alpha_intra, public.bw_intra)
    a_x, bw_x = _link(records, "2x1") if "2x1" in topos else (public.alpha_inter, public.bw_inter)
    return CostModel(alpha_intra=a_in, bw_intra=bw_in, alpha_inter=a_x, bw_inter=bw_x,
                     source=f"calibrated on {socket.gethostname()} ({backend})",
                     extrapolate=backend != "cpu", measured=measured)


def main(argv: list[str] | None = None) -> None:
    from collectives.profile import cached_path
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="default: auto's cache")
    parser.add_argument("--reps", type=int, default=7)
    worker = parser.add_argument_group("worker (internal)")
    worker.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    worker.add_argument("--mpi", action="store_true", help=argparse.SUPPRESS)
    for name in ("--processes", "--devices", "--pid", "--port"):
        worker.add_argument(name, type=int, default=0, help=argparse.SUPPRESS)
    worker.add_argument("--specs", nargs="*", default=[], help=argparse.SUPPRESS)
    worker.add_argument("--ops", nargs="*", default=OPS, help=argparse.SUPPRESS)
    worker.add_argument("--algos", nargs="*", default=ALGOS, help=argparse.SUPPRESS)
    worker.add_argument("--sizes", nargs="*", type=int, default=SIZES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(args)
    model, records = calibrate(args.reps)
    out = args.out or cached_path()
    model.save(out)
    print(f"{len(records)} timings; {model.source}; saved to {out}")


if __name__ == "__main__":
    sys.exit(main())
