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

``--trace`` prints the traced steps instead (the check's kernels section): each row's
seconds in GEMMs, in attention and in the rest (memory-bound kernels, copies, gaps),
against the planner's split of its step (:func:`jaxsmp.plan.throughput.kernel_seconds`).
``--rates`` derives the planner's ``matmul`` and ``attention`` constants from them:
per traced row, the planner's GEMM and attention seconds at 1 over the traced ones,
and the slowest row's (``jaxsmp.plan.calibration.FITTED``).
``--layers`` prints a layer's memory-bound work per remat policy in the traced GPT-NeoX
row's step (1.3b, 8 x 2048 tokens, one H100): compiled (XLA:GPU deviceless at 4 and 8
layers, the growth per layer) against the planner's (about a minute a policy).

    python bench/plan_vs_measured.py [--trace | --rates | --layers]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("JAX_PLATFORMS", "cpu")   # --layers compiles for a GPU deviceless

from bench.gpucheck.planner import one_gpu, planner_gpu, priced, rows
from jaxsmp.plan import Candidate, Cluster, Workload, generic_node
from jaxsmp.plan.calibration import FITTED, Fitted
from jaxsmp.plan.throughput import kernel_seconds

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Measured:
    label: str          # the check's section and row
    gpu: str            # the planner's GPU for the device it ran on
    workload: Workload
    candidate: Candidate
    seconds: float      # the measured step (median after a warm-up step)
    source: str         # the results file


def _stored(results: Path):
    """(file, its start time, its planner GPU, its sections) of each stored check run on
    a GPU the planner knows."""
    for path in sorted(results.glob("*.json")):
        data = json.loads(path.read_text())
        sections = data.get("sections", {})
        facts = [r.get("facts", {}) for r in sections.get("environment", {}).get("rows", [])]
        gpu, _ = planner_gpu(facts[0].get("device_kind", "") if facts else "")
        if gpu is not None:
            yield path, data.get("meta", {}).get("started", ""), gpu, sections


def measured_rows(results: Path = RESULTS) -> list[Measured]:
    """Every jaxsmp row of the stored GPU checks, the newest file's where several
    time the same row on the same kind of GPU."""
    found: dict[tuple[str, str], tuple[str, Measured]] = {}
    for path, started, gpu, sections in _stored(results):
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


@dataclass(frozen=True)
class Traced:
    label: str
    gpu: str
    traced: tuple[float, float, float, float]    # step, GEMMs, attention, the rest
    planned: tuple[float, float, float, float]


def traced_rows(results: Path = RESULTS, fitted: Fitted = FITTED) -> list[Traced]:
    """Every traced jaxsmp step of the stored checks (their kernels section) beside the
    planner's split of the same step on one GPU of its kind."""
    out = []
    for _, _, gpu, sections in _stored(results):
        for r in sections.get("kernels", {}).get("rows", []):
            if r.get("status") != "ok":
                continue
            workload, candidate = priced(r)
            step = one_gpu(workload, candidate, gpu, fitted).throughput.step_seconds
            gemms, attention = kernel_seconds(
                workload, candidate, Cluster(generic_node(gpu, gpus=1), 1), fitted=fitted)
            traced = (r["step_s"], r["gemm_s"], r["attention_s"])
            out.append(Traced(r["label"], gpu, (*traced, traced[0] - sum(traced[1:])),
                              (step, gemms, attention, step - gemms - attention)))
    return out


def layer_memory(remat: str) -> tuple[float, float]:
    """(compiled, planned) memory-bound seconds a layer of GPT-NeoX 1.3b adds to a step
    of 8 x 2048 tokens on one H100 with ``remat``."""
    import jaxsmp
    from jaxsmp.plan.calibrate import DEPTHS, compiled_memory
    from jaxsmp.plan.traffic import memory_bound, stash_seconds
    config = jaxsmp.models.preset("gpt_neox", "1.3b")
    c = Candidate(1, 1, 1, 1, 8, 1, remat)
    low, high = (compiled_memory(config, c, "H100-SXM", d) for d in DEPTHS)
    w, one = Workload(config, 2048), Cluster(generic_node("H100-SXM", gpus=1), 1)
    activations, weights, _ = memory_bound(w, c, one)
    planned = (activations * w.memory_scale.layer + weights * w.memory_scale.weights
               + stash_seconds(w, c, one)) / w.layers
    return (high - low) / (DEPTHS[1] - DEPTHS[0]), planned


def traced_rates(results: Path = RESULTS) -> list[tuple[str, float, float]]:
    """(row, GEMM constant, attention constant) per traced step: the planner's seconds
    with both constants at 1 over the traced seconds."""
    rows = traced_rows(results, Fitted(1.0, 1.0, FITTED.overlap))
    return [(t.label, t.planned[1] / t.traced[1], t.planned[2] / t.traced[2]) for t in rows]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", action="store_true",
                        help="the traced steps' GEMMs, attention and rest against the plan")
    parser.add_argument("--rates", action="store_true",
                        help="the matmul and attention constants the traced steps give")
    parser.add_argument("--layers", action="store_true",
                        help="a layer's memory-bound work per remat policy, compiled and planned")
    args = parser.parse_args(argv)
    if args.rates:
        rates = traced_rates()
        print("| traced row | matmul | attention |\n|---|---|---|")
        for label, gemm, attention in rates:
            print(f"| {label} | {gemm:.3f} | {attention:.3f} |")
        print(f"| the slowest | {min(r[1] for r in rates):.3f} "
              f"| {min(r[2] for r in rates):.3f} |")
    elif args.layers:
        print("| remat | compiled ms a layer | planned ms a layer |\n|---|---|---|")
        for remat in ("none", "full", "save_matmuls"):
            compiled, planned = layer_memory(remat)
            print(f"| {remat} | {compiled * 1e3:.2f} | {planned * 1e3:.2f} |", flush=True)
    elif args.trace:
        print("| row | GPU | step: traced, planned | GEMMs | attention | the rest |")
        print("|---|---|---|---|---|---|")
        for t in traced_rows():
            parts = " | ".join(f"{a:.3f}, {b:.3f}" for a, b in zip(t.traced, t.planned))
            print(f"| {t.label} | {t.gpu} | {parts} |")
    else:
        print("| row | GPU | measured s | predicted s | error (tokens/s) | file |")
        print("|---|---|---|---|---|---|")
        for row in measured_rows():
            print(f"| {row.label} | {row.gpu} | {row.seconds:.4f} "
                  f"| {predicted_seconds(row):.4f} | {error(row):+.1%} | {row.source} |")
    print(f"\nconstants: {FITTED}")


if __name__ == "__main__":
    main()
