"""Section 3: ``precision="fp8"`` against bf16, GPT-NeoX 1.3b at seq 2048, batch 8, remat
none: step time, and the cuBLASLt FP8 GEMM calls (``__cublas$lt$matmul$f8``) in the
step's compiled program (``step.lower(state, batch).compile().as_text()``, the step and
shapes that were timed; ``jaxsmp.plan.gpu_target.count_fp8_gemms``)."""
from __future__ import annotations

TITLE = "3. FP8 against bf16"
ISOLATE = True
COLUMNS = [("model", "model", ""), ("seq", "seq", ""), ("batch", "batch", ""),
           ("precision", "precision", ""), ("step_s", "step s", ".4f"),
           ("tokens_per_s", "tokens/s", ",.0f"), ("fp8_gemms", "FP8 GEMM call sites", ""),
           ("peak_gib", "peak GiB", ".2f"), ("first_call_s", "compile+1st s", ".1f")]
NOTES = """FP8 GEMM call sites are counted in the compiled HLO text (a call inside the layer
loop's body counts once, whatever the number of layers). XLA:CPU has no cuBLASLt: with
`--smoke` the fp8 step runs its float8 matmuls another way and the count is 0."""


def rows(ctx: dict, results: dict) -> list[dict]:
    from bench.gpucheck.training import model_row
    smoke = ctx["smoke"]
    model = model_row("gpt_neox", "tiny" if smoke else "1.3b", 64 if smoke else 2048,
                      2 if smoke else 8, 4 if smoke else 24, smoke)
    return [{**model, "precision": p, "remat": "none", "contender": "jaxsmp",
             "label": f"{model['model']} {p}"} for p in ("bf16", "fp8")]


def run(row: dict, ctx: dict, deadline: float) -> dict:
    from bench.gpucheck.jax_steps import measure_jaxsmp
    from jaxsmp.plan.gpu_target import count_fp8_gemms
    out, state, step, batch = measure_jaxsmp(row, deadline, ctx["target_s"], row["precision"])
    out["fp8_gemms"] = count_fp8_gemms(step.lower(state, batch).compile().as_text())
    out["tokens_per_s"] = row["batch"] * row["seq"] / out["step_s"]
    return out
