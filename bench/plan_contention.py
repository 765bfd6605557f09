"""How much the planner's accuracy rests on its SM-contention term: the compute beside a
hidden collective loses the share of the SMs NCCL's kernels hold
(``GPU.collective_sm_share``: 16 of 108 on A100, 24 of 132 on H100, sourced in
:mod:`jaxsmp.plan.hardware`, not fitted). For each scale ``k`` of those shares (0: no
contention; 1: the planner's) the fitted constants are refitted on the fit rows of
``bench/plan_vs_published.py`` (its own fit), then the held-out rows and scaling trends
are scored as that script scores them (docs/planner.md's table). Seconds on 2 cores.

    python bench/plan_contention.py
"""
from __future__ import annotations

import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import plan_vs_published as pvp

from jaxsmp.plan.hardware import Cluster

_CLUSTER = pvp._cluster


def scaled(k: float):
    """``plan_vs_published._cluster`` with its GPU's SM share scaled by ``k``."""
    def cluster(name: str, nodes: int) -> Cluster:
        base = _CLUSTER(name, nodes)
        gpu = replace(base.node.gpu, collective_sm_share=k * base.node.gpu.collective_sm_share)
        return Cluster(replace(base.node, gpu=gpu), nodes)
    return cluster


def main() -> None:
    fit_rows = [r for r in pvp.RUNS if r.name in pvp.FIT]
    print("| k | fitted | fit rows' mean error | median held out | largest held out | "
          "trends of the published sign | trends within 10 points |\n|---|---|---|---|---|---|---|")
    for k in (0.0, 0.5, 1.0, 1.5, 2.0):
        pvp._cluster = scaled(k)
        fitted = pvp.fit(fit_rows)
        loss = statistics.fmean(abs(pvp.error(r, fitted)) for r in fit_rows)
        s = pvp.summary(fitted, choice=False)
        signs = sum((p > 0) == (q > 0) for p, q, _ in s["series"].values())
        within = sum(abs(p - q) <= 0.10 for p, q, _ in s["series"].values())
        print(f"| {k} | {fitted} | {loss:.2%} | {s['median']:.1%} | {s['worst']:.1%} | "
              f"{signs} | {within} |", flush=True)
    pvp._cluster = _CLUSTER


if __name__ == "__main__":
    main()
