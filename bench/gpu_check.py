"""jaxsmp measured on one GPU in one command: training throughput and MFU
against a hand-written JAX step and PyTorch, attention kernels, FP8, remat, the
planner's prediction, the environment; at most 8 minutes, each section under a budget.

    python bench/gpu_check.py --out "$OUT"        # on the GPU machine: give it 540 s
    python bench/gpu_check.py --smoke             # every section on CPU, tiny shapes

Writes bench/results/<date>-<gpu>.md and .json (and into --out). The sections live in
bench/gpucheck/ (its __init__ says what each measures); docs/benchmarks.md, "GPU check".
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    base_env = dict(os.environ)   # the workers' environment, before jaxsmp sets flags
    root = Path(__file__).resolve().parents[1]
    # bench/collectives.py would shadow the ``collectives`` package jaxsmp imports
    sys.path[:] = [str(root)] + [p for p in sys.path
                                 if Path(p or ".").resolve() != root / "bench"]
    from bench.gpucheck.runner import main
    sys.exit(main(base_env=base_env))
