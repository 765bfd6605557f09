"""The planner's held-out errors against published runs, grouped by where they come from:
the framework that published them, the GPU and the remat policy (what one set of fitted
constants has to serve at once). Reads ``bench/plan_vs_published.py``'s summary.

    python bench/plan_bias.py
"""
from __future__ import annotations

import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from plan_vs_published import _cluster, kind, summary

FRAMEWORKS = (("MPT-", "llm-foundry"), ("MaxText", "MaxText"), ("torchtitan", "torchtitan"))


def framework(name: str) -> str:
    return next((label for prefix, label in FRAMEWORKS if name.startswith(prefix)),
                "Megatron")


def groups(result: dict) -> dict[tuple[str, str, str], list[float]]:
    """(framework, GPU, remat) -> the held-out rows' signed errors."""
    out: dict = defaultdict(list)
    for run in result["rows"]:
        if kind(run) == "held out":
            gpu = _cluster(run.node, 1).node.gpu.name
            out[framework(run.name), gpu, run.candidate.remat].append(
                result["held_out"][run.name])
    return dict(sorted(out.items()))


def main() -> None:
    print("| framework | GPU | remat | held-out rows | mean error | range |")
    print("|---|---|---|---|---|---|")
    for (frame, gpu, remat), errors in groups(summary(choice=False)).items():
        print(f"| {frame} | {gpu} | {remat} | {len(errors)} | "
              f"{statistics.fmean(errors):+.1%} | {min(errors):+.1%} to {max(errors):+.1%} |")


if __name__ == "__main__":
    main()
