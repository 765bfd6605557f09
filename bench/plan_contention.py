"""An experiment on the planner's time model, not adopted: collectives slowing the
compute they overlap (NCCL's kernels take SMs and HBM bandwidth from the GEMMs beside
them). Each layer's overlapped compute is charged ``c`` times the collective time it
hides; for each ``c`` the fitted constants are refitted on the fit rows of
``bench/plan_vs_published.py`` (its own fit), then the held-out rows and scaling
trends are scored as that script scores them (docs/planner.md's table). Seconds on
2 cores.

    python bench/plan_contention.py
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import plan_vs_published as pvp

import jaxsmp.plan.throughput as throughput

_OVERLAPPED = throughput._overlapped


def with_contention(c: float):
    """``throughput._overlapped`` with the hidden collective time charged ``c`` times."""
    def overlapped(layer, semantics, overlap):
        compute, exposed, offload = _OVERLAPPED(layer, semantics, overlap)
        hidden = layer.gather + layer.reduce_scatter - exposed
        return compute + c * min(hidden, compute), exposed, offload
    return overlapped


def main() -> None:
    fit_rows = [r for r in pvp.RUNS if r.name in pvp.FIT]
    print("| c | fitted | fit rows' mean error | median held out | largest held out | "
          "trends of the published sign | trends within 10 points |\n|---|---|---|---|---|---|---|")
    for c in (0.0, 0.1, 0.2, 0.3, 0.4):
        throughput._overlapped = with_contention(c)
        fitted = pvp.fit(fit_rows)
        loss = statistics.fmean(abs(pvp.error(r, fitted)) for r in fit_rows)
        s = pvp.summary(fitted, choice=False)
        signs = sum((p > 0) == (q > 0) for p, q, _ in s["series"].values())
        within = sum(abs(p - q) <= 0.10 for p, q, _ in s["series"].values())
        print(f"| {c} | {fitted} | {loss:.2%} | {s['median']:.1%} | {s['worst']:.1%} | "
              f"{signs} | {within} |", flush=True)
    throughput._overlapped = _OVERLAPPED


if __name__ == "__main__":
    main()
