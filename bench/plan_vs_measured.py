"""The planner against jaxsmp's own step, measured on a GPU.

``bench/plan_vs_published.py`` checks the time model on published runs of other stacks
(PyTorch FSDP, Megatron, MaxText). This checks it on the program the planner plans:
every jaxsmp row that ``bench/gpu_check.py`` timed (its training, fp8 and remat
sections, stored in ``bench/results/*.json``), predicted by ``jaxsmp.plan.evaluate`` for
one GPU of the kind it ran on, as that check's planner section does. Where several files time
the same row on the same kind of GPU, the newest (by the check's start time) stands: a
rerun after a fix to the step replaces what the fix changed. Errors are in tokens per second, + where the
planner is too fast, as in the published table. None of these rows is fitted, except
that offload's host-link rate (``hardware.PCIE_GEN5``) was derived from its row.

    python bench/plan_vs_measured.py
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpucheck.planner import one_gpu, planner_gpu, priced, rows
from jaxsmp.plan import Candidate, Workload
from jaxsmp.plan.calibration import FITTED, Fitted

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Measured:
    label: str          # the check's section and row
    gpu: str            # the planner's GPU for the device it ran on
    workload: Workload
    candidate: Candidate
    seconds: float      # the measured step (median after a warm-up step)
    source: str         # the results file


def measured_rows(results: Path = RESULTS) -> list[Measured]:
    """Every jaxsmp row of the stored GPU checks, the newest file's where several
    time the same row on the same kind of GPU."""
    found: dict[tuple[str, str], tuple[str, Measured]] = {}
    for path in sorted(results.glob("*.json")):
        data = json.loads(path.read_text())
        sections = data.get("sections", {})
        facts = [r.get("facts", {}) for r in sections.get("environment", {}).get("rows", [])]
        gpu, _ = planner_gpu(facts[0].get("device_kind", "") if facts else "")
        if gpu is None:
            continue
        started = data.get("meta", {}).get("started", "")
        for r in rows({}, sections):
            row = Measured(r["label"], gpu, *priced(r), r["measured_s"], path.name)
            key = (r["label"], gpu)
            if key not in found or found[key][0] < started:
                found[key] = (started, row)
    return [row for _, row in found.values()]


def predicted_seconds(row: Measured, fitted: Fitted = FITTED) -> float:
    """The planner's step on one GPU, as gpu_check's planner section prices it."""
    return one_gpu(row.workload, row.candidate, row.gpu, fitted).throughput.step_seconds


def error(row: Measured, fitted: Fitted = FITTED) -> float:
    """Predicted tokens/s over measured, less 1."""
    return row.seconds / predicted_seconds(row, fitted) - 1


def main() -> None:
    print("| row | GPU | measured s | predicted s | error (tokens/s) | file |")
    print("|---|---|---|---|---|---|")
    for row in measured_rows():
        print(f"| {row.label} | {row.gpu} | {row.seconds:.4f} | {predicted_seconds(row):.4f} "
              f"| {error(row):+.1%} | {row.source} |")
    print(f"\nconstants: {FITTED}")


if __name__ == "__main__":
    main()
