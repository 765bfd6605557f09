"""Section 7: the planner's single-GPU step time (``jaxsmp.plan.evaluate`` of
``Candidate(1, 1, 1, 1, batch, 1, remat, precision)`` on one GPU of the measured kind,
jaxsmp's target semantics) against each jaxsmp row measured above. Runs on the CPU
(``JAX_PLATFORMS=cpu``): the planner needs no device."""
from __future__ import annotations

TITLE = "7. Planner against measurement"
ISOLATE = False
ENV = {"JAX_PLATFORMS": "cpu"}
COLUMNS = [("source", "row", ""), ("model", "model", ""), ("seq", "seq", ""),
           ("batch", "batch", ""), ("remat", "remat", ""), ("precision", "precision", ""),
           ("gpu", "planned GPU", ""), ("predicted_s", "predicted s", ".4g"),
           ("measured_s", "measured s", ".4g"), ("ratio", "predicted / measured", ".2f"),
           ("predicted_gib", "predicted GiB", ".2f"), ("measured_gib", "peak GiB", ".2f")]
NOTES = """The planner's GEMM and attention rates come from one H100's trace of jaxsmp's
step, its overlap from published multi-GPU runs (`jaxsmp/plan/calibration.py`); a row
here checks them on jaxsmp's own step (on another GPU kind, independently). Stored in
`bench/results/`, the run's JSON joins `python bench/plan_vs_measured.py`, and its rows
(offload aside) `tests/jaxsmp/test_plan_measured.py`'s 10% bound. Its memory is
the model's per-device peak against `peak_bytes_in_use`."""

SECTIONS = ("training", "fp8", "remat")


def planner_gpu(kind: str) -> tuple[str | None, str]:
    """The planner's GPU for a device kind, and a note."""
    for name, gpu in (("H200", "H200"), ("H100", "H100-SXM")):
        if name in kind:
            return gpu, "" if "PCIe" not in kind else "planned as SXM (no PCIe entry)"
    if "A100" in kind:
        return ("A100-80GB" if "80GB" in kind else "A100-40GB"), ""
    return None, f"no planner GPU for {kind!r}"


def rows(ctx: dict, results: dict) -> list[dict]:
    out = []
    for section in SECTIONS:
        for row in results.get(section, {}).get("rows", []):
            if row.get("contender") != "jaxsmp" or row["status"] != "ok":
                continue
            out.append({k: row[k] for k in ("family", "preset", "config", "model", "seq",
                                            "batch") if k in row}
                       | {"remat": row.get("remat", "none"),
                          "precision": row.get("precision", "bf16"), "source": section,
                          "measured_s": row["step_s"], "measured_gib": row.get("peak_gib"),
                          "label": f"{section}: {row['label']}"})
    return out


def priced(row: dict):
    """(workload, candidate) of a measured row: its model and its step on one GPU."""
    import jaxsmp
    from jaxsmp.plan import Candidate, Workload
    config = jaxsmp.models.preset(row["family"], row["preset"], **row["config"])
    return (Workload(config, row["seq"]),
            Candidate(1, 1, 1, 1, row["batch"], 1, row["remat"], row["precision"]))


def one_gpu(workload, candidate, gpu: str, fitted=None):
    """``jaxsmp.plan.evaluate`` of ``candidate`` on one ``gpu`` (``fitted``: the planner's
    constants, its own by default)."""
    from jaxsmp.plan import Cluster, evaluate, generic_node
    from jaxsmp.plan.calibration import FITTED
    return evaluate(workload, candidate, Cluster(generic_node(gpu, gpus=1), 1),
                    fitted=fitted or FITTED)


def run(row: dict, ctx: dict, deadline: float) -> dict:
    from bench.gpucheck.common import Skip
    env = ctx["env"]
    if ctx["smoke"]:
        gpu, note = "H100-SXM", "not comparable: measured on CPU (--smoke)"
    else:
        gpu, note = planner_gpu(env.get("device_kind", ""))
        if gpu is None:
            raise Skip(note)
    plan = one_gpu(*priced(row), gpu)
    out = {"gpu": gpu, "predicted_s": plan.throughput.step_seconds,
           "predicted_gib": plan.memory.total / 2**30, "note": note}
    if not ctx["smoke"]:
        out["ratio"] = out["predicted_s"] / row["measured_s"]
    return out
