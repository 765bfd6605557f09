"""Section 5: jaxsmp's ``remat`` policies on GPT-NeoX 1.3b, seq 2048, batch 8, bf16:
step time and peak memory (each row in its own process on a GPU)."""
from __future__ import annotations

TITLE = "5. Recomputation policies"
ISOLATE = True
POLICIES = ("none", "full", "save_matmuls", "offload")
COLUMNS = [("model", "model", ""), ("seq", "seq", ""), ("batch", "batch", ""),
           ("remat", "remat", ""), ("step_s", "step s", ".4f"),
           ("tokens_per_s", "tokens/s", ",.0f"), ("peak_gib", "peak GiB", ".2f"),
           ("first_call_s", "compile+1st s", ".1f")]
NOTES = """`offload` moves what `save_matmuls` keeps to pinned host memory; XLA:CPU drops
host offloads, so jaxsmp refuses it there (skipped with `--smoke`)."""


def rows(ctx: dict, results: dict) -> list[dict]:
    from bench.gpucheck.training import model_row
    smoke = ctx["smoke"]
    model = model_row("gpt_neox", "tiny" if smoke else "1.3b", 64 if smoke else 2048,
                      2 if smoke else 8, 4 if smoke else 24, smoke)
    return [{**model, "precision": "bf16", "remat": r, "contender": "jaxsmp",
             "label": f"{model['model']} remat={r}"} for r in POLICIES]


def run(row: dict, ctx: dict, deadline: float) -> dict:
    from bench.gpucheck.common import Skip
    from bench.gpucheck.jax_steps import run_jaxsmp
    if row["remat"] == "offload" and ctx["env"]["platform"] == "cpu":
        raise Skip("XLA:CPU drops host offloads; jaxsmp refuses remat='offload' there")
    out = run_jaxsmp(row, deadline, ctx["target_s"], remat=row["remat"])
    out["tokens_per_s"] = row["batch"] * row["seq"] / out["step_s"]
    return out
