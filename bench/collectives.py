"""Benchmark the collective algorithms on this machine, and what ``auto`` picks.

    python bench/collectives.py [--max-bytes 64M] [--cost-model PATH] [--plot out.png]

Tables (all_gather and reduce_scatter, per-rank shard sizes 1 KiB .. 64 MiB, reduce-scatter
capped by --max-rs-bytes for memory): 1 process x 8 CPU devices; 4 processes x 1 device,
2 processes x 4 devices and dp=2 x sdp=4 on 4 processes x 2 devices under mpiexec (``ffi``
included; gloo carries XLA's collectives; without MPI, 2 x 4 as local processes). Each cell:
median time, ratio to the fastest algorithm of that size, and the bytes that cross process
boundaries per sdp group (from the algorithm's pattern; ``?``: XLA decides). The contenders
of one size are timed in alternation (collectives.calibrate.measure). ``auto``: its pick
under the cost model (the calibration cached for this host, or --cost-model) and that
pick's time over the fastest. Prints markdown.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ALGOS = ["xla", "ring", "a2a", "hierarchical"]
# (title, processes, devices per process, spec, under mpiexec)
CASES = [
    ("1 process x 8 devices", 1, 8, "1x8", False),
    ("4 processes x 1 device (mpiexec)", 4, 1, "4x1", True),
    ("2 processes x 4 devices (mpiexec)", 2, 4, "2x4", True),
    ("dp=2 x sdp=4 on 4 processes x 2 devices (mpiexec)", 4, 2, "dp=2,sdp=4", True),
]
NO_MPI_CASES = [("2 processes x 4 devices (gloo)", 2, 4, "2x4", False)]


def _sizes(max_bytes: int) -> list[int]:
    return [1 << k for k in range(10, 40, 2) if 1 << k <= max_bytes]


def _human(nbytes: int | None) -> str:
    if nbytes is None:
        return "?"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:g} {unit}"
    return f"{nbytes} B"


def table(results: list[dict], model) -> tuple[str, list[float]]:
    """Markdown table and auto's ratios to the fastest algorithm, one per row."""
    from collectives import Topology, auto, cost_model
    algos = list(dict.fromkeys(r["algo"] for r in results))
    head = ["op", "bytes/rank"] + [f"{a} ms (x best, x-proc bytes)" for a in algos] + ["auto"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ratios = []
    for op, nbytes, topo in dict.fromkeys((r["op"], r["bytes"], r["topo"]) for r in results):
        times = {r["algo"]: r["seconds"] for r in results
                 if (r["op"], r["bytes"]) == (op, nbytes)}
        best = min(times.values())
        hosts, per_host = map(int, topo.split("x"))
        t = Topology(hosts, per_host)
        cells = [op, _human(nbytes)]
        for a in algos:
            xb = cost_model.cross_host_bytes(a, nbytes, t)
            cells.append(f"{times[a] * 1e3:.3f} ({times[a] / best:.2f}x, {_human(xb)})")
        d = auto.decide(nbytes, t, model, op=op, ffi="ffi" in times)
        ratios.append(times[d.pick] / best)
        cells.append(f"{d.pick} ({ratios[-1]:.2f}x)")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines), ratios


def plot(tables: dict[str, list[dict]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ops = ["all_gather", "reduce_scatter"]
    fig, axes = plt.subplots(len(ops), len(tables), figsize=(4.5 * len(tables), 7),
                             squeeze=False)
    for col, (title, results) in enumerate(tables.items()):
        for row, op in enumerate(ops):
            ax = axes[row][col]
            for a in dict.fromkeys(r["algo"] for r in results):
                pts = sorted((r["bytes"], r["seconds"]) for r in results
                             if r["algo"] == a and r["op"] == op)
                ax.loglog([b for b, _ in pts], [s * 1e3 for _, s in pts], marker="o", label=a)
            ax.set_title(f"{op}\n{title}", fontsize=8)
            ax.set_xlabel("bytes per rank")
            ax.set_ylabel("ms")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-bytes", type=int, default=64 << 20)
    parser.add_argument("--max-rs-bytes", type=int, default=16 << 20,
                        help="reduce-scatter inputs are p x larger: cap them for memory")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--cost-model", type=Path, help="CostModel JSON for auto "
                        "(default: the calibration cached for this host)")
    parser.add_argument("--only", help="run only the cases whose title contains this")
    parser.add_argument("--plot", type=Path, help="write a plot of every table here")
    args = parser.parse_args()

    from collectives import CostModel, calibrate
    from collectives.auto import resolve
    from collectives.ffi.build import BuildError, find_mpi, find_mpiexec
    model, why = resolve(CostModel.load(args.cost_model) if args.cost_model else None)
    try:
        mpi = find_mpiexec() is not None and bool(find_mpi())
    except BuildError:
        mpi = False
    cases = [c for c in (CASES if mpi else CASES[:1] + NO_MPI_CASES)
             if not args.only or args.only in c[0]]
    print(f"auto's cost model: {why}\n")
    tables, worst = {}, []
    for title, processes, devices, spec, under_mpi in cases:
        algos = ALGOS
        results = calibrate.run(processes, devices, [spec], ops=["all_gather"],
                                sizes=_sizes(args.max_bytes), reps=args.reps, mpi=under_mpi,
                                algos=algos)
        results += calibrate.run(processes, devices, [spec], ops=["reduce_scatter"],
                                 sizes=_sizes(args.max_rs_bytes), reps=args.reps,
                                 mpi=under_mpi, algos=algos)
        text, ratios = table(results, model)
        tables[title] = results
        worst.append((max(ratios), title))
        print(f"### {title}\n\n{text}\n", flush=True)
    print("auto's worst ratio to the fastest algorithm per table: "
          + ", ".join(f"{title}: {r:.2f}x" for r, title in worst))
    if args.plot:
        plot(tables, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
