"""Benchmark the collective algorithms across JAX processes on this machine.

    python bench/collectives.py [--max-bytes 64M] [--cost-model PATH] [--ffi]

Table 1: 2 processes x 4 CPU devices (gloo between processes), per-rank shard sizes
1 KiB .. 64 MiB (powers of 4); median time of xla / ring / a2a / hierarchical, the
bytes that cross the process boundary (from each algorithm's pattern), the ratio to
xla, and what ``auto`` picks under the p4d cost model (and a calibrated one if given).
Table 2 (``--ffi``): 4 processes x 1 device under mpiexec, the MPI FFI custom call
against xla / a2a over gloo. Prints markdown.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ALGOS = ["xla", "ring", "a2a", "hierarchical"]


def _sizes(max_bytes: int) -> list[int]:
    return [1 << k for k in range(10, 40, 2) if 1 << k <= max_bytes]


def _reps(nbytes: int) -> int:
    return 10 if nbytes <= 1 << 20 else 5 if nbytes <= 1 << 24 else 3


def worker(process_id: int, nproc: int, port: int, devices: int, algos: list[str],
           ops: list[str], max_bytes: int) -> None:
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import gc

    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=nproc, process_id=process_id,
                               initialization_timeout=120)
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    import collectives
    from collectives.timing import median_seconds

    mesh = Mesh(np.array(sorted(jax.devices(), key=lambda d: (d.process_index, d.id))), ("x",))
    p = mesh.size
    sharding = NamedSharding(mesh, P("x"))
    results = []
    for op in ops:
        for nbytes in _sizes(max_bytes):
            n = nbytes // 4  # float32 elements per rank
            per_device = n * (p if op == "reduce_scatter" else 1)
            x = jax.make_array_from_callback((p * per_device,), sharding,
                                             lambda idx: np.ones(per_device, np.float32))
            for algo in algos:
                fn = getattr(collectives, op)
                f = jax.jit(jax.shard_map(lambda v: fn(v, "x", algorithm=algo), mesh=mesh,
                                          in_specs=P("x"), out_specs=P("x")))
                t = median_seconds(lambda: f(x).block_until_ready(), _reps(nbytes))
                results.append({"op": op, "bytes": nbytes, "algo": algo, "seconds": t})
                del f
                gc.collect()
            del x
    if process_id == 0:
        print("RESULTS " + json.dumps(results), flush=True)


def _launch_local(nproc: int, devices: int, algos: list[str], ops: list[str], max_bytes: int):
    from collectives.timing import launch
    outs = launch(lambda i, port: [__file__, "--worker", str(i), str(nproc), str(port),
                                   "--devices", str(devices), "--algos", ",".join(algos),
                                   "--ops", ",".join(ops), "--max-bytes", str(max_bytes)],
                  nproc, timeout=3600)
    return _parse(outs[0])


def _launch_mpi(nproc: int, algos: list[str], ops: list[str], max_bytes: int):
    from collectives.timing import free_port
    from collectives.ffi.build import find_mpiexec
    mpiexec = find_mpiexec() or "mpiexec"
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    cmd = [mpiexec, "-n", str(nproc), sys.executable, __file__, "--worker", "mpi", str(nproc),
           str(free_port()), "--devices", "1", "--algos", ",".join(algos), "--ops", ",".join(ops),
           "--max-bytes", str(max_bytes)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env)
    if run.returncode:
        raise RuntimeError(run.stderr[-4000:])
    return _parse(run.stdout)


def _parse(out: str) -> list[dict]:
    line = next(l for l in out.splitlines() if l.startswith("RESULTS "))
    return json.loads(line[len("RESULTS "):])


def _human(nbytes: int | None) -> str:
    if nbytes is None:
        return "?"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:g} {unit}"
    return f"{nbytes} B"


def table(results: list[dict], topo, algos: list[str], models: dict) -> str:
    from collectives import auto, cost_model
    head = ["op", "bytes/rank"] + [f"{a} ms (x-proc bytes)" for a in algos]
    head += [f"auto ({name})" for name in models]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    keys = sorted({(r["op"], r["bytes"]) for r in results}, key=lambda k: (k[0], k[1]))
    for op, nbytes in keys:
        times = {r["algo"]: r["seconds"] for r in results if (r["op"], r["bytes"]) == (op, nbytes)}
        base = times.get("xla")
        cells = [op, _human(nbytes)]
        for a in algos:
            ratio = f", {times[a] / base:.2f}x" if base and a != "xla" else ""
            xb = cost_model.cross_host_bytes(a, nbytes, topo)
            cells.append(f"{times[a] * 1e3:.3f}{ratio} ({_human(xb)})")
        for name, model in models.items():
            pick = auto.choose(nbytes, topo, model)
            ratio = f"{times[pick] / base:.2f}x" if base and pick in times else "n/a"
            cells.append(f"{pick} ({ratio})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=3)
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--algos", default=",".join(ALGOS))
    parser.add_argument("--ops", default="all_gather,reduce_scatter")
    parser.add_argument("--max-bytes", type=int, default=64 << 20)
    parser.add_argument("--max-rs-bytes", type=int, default=16 << 20,
                        help="reduce-scatter inputs are p x larger: cap them for memory")
    parser.add_argument("--cost-model", type=Path, help="calibrated CostModel JSON for auto")
    parser.add_argument("--ffi", action="store_true", help="also run the MPI FFI table")
    args = parser.parse_args()
    algos, ops = args.algos.split(","), args.ops.split(",")
    if args.worker:
        pid, nproc, port = args.worker
        pid = int(os.environ.get("PMI_RANK", 0)) if pid == "mpi" else int(pid)
        return worker(pid, int(nproc), int(port), args.devices, algos, ops, args.max_bytes)

    from collectives import CostModel, Topology
    models = {"p4d model": CostModel.p4d()}
    if args.cost_model:
        models["calibrated"] = CostModel.load(args.cost_model)
    results = _launch_local(2, 4, ALGOS, ["all_gather"], args.max_bytes)
    if "reduce_scatter" in ops:
        results += _launch_local(2, 4, ALGOS, ["reduce_scatter"], args.max_rs_bytes)
    print("### 2 processes x 4 CPU devices (gloo between processes)\n")
    print(table(results, Topology(2, 4), ALGOS, models))
    if args.ffi:
        ffi_algos = ["xla", "a2a", "ffi"]
        res = _launch_mpi(4, ffi_algos, ops, args.max_rs_bytes)
        print("\n### 4 processes x 1 CPU device under mpiexec (ffi = MPI custom call)\n")
        print(table(res, Topology(4, 1), ffi_algos, {}))


if __name__ == "__main__":
    main()
