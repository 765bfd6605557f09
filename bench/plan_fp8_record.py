"""The planner against MaxText's published FP8 scaling tables, for the record: not held
out in ``bench/plan_vs_published.py`` (every row there is bf16, and the planner's FP8
GEMM rate is an assumption, no FP8 MAMF being measured). docs/planner.md quotes it.

    python bench/plan_fp8_record.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import plan_vs_published as pvp

from bench.published_runs import GPU_NODE, LLAMAS, MAXTEXT, Run
from jaxsmp.plan import Candidate

# the FP8 tables of the recipes whose bf16 tables are held out (bench/data/
# published_scaling.csv's MaxText rows: 2 sequences per GPU, ZeRO-3 over every GPU up to
# 256, over 128 with DP beyond): model -> (sequence length, step seconds per GPU count)
FP8_STEPS = {"llama2_70b": (4096, {64: 4.324, 128: 4.556, 256: 4.959, 512: 5.043,
                                   1024: 5.062, 2048: 4.93}),
             "llama3_70b": (8192, {128: 9.074, 256: 9.488, 512: 9.244, 1024: 9.483,
                                   2048: 9.339})}


def main() -> None:
    """Predicted against MaxText's FP8 tables, and each table's trend."""
    for model, (seq, steps) in FP8_STEPS.items():
        title, config, kernel, _ = LLAMAS[model]
        pairs = []
        for gpus, seconds in steps.items():
            sdp = gpus if gpus <= 256 else 128
            c = Candidate(gpus // sdp, sdp, 1, 1, 2, 1, "save_qkv", "fp8")
            run = Run(f"{title} fp8 x{gpus}", config, GPU_NODE["h100"], gpus // 8, seq, c,
                      2 * seq / seconds, MAXTEXT, attention=kernel, compiled=True)
            pairs.append((run.tokens_per_gpu, pvp.predicted(run)[0]))
            print(f"| {run.name} | {pairs[-1][0]:,.0f} | {pairs[-1][1]:,.0f} | "
                  f"{pairs[-1][1] / pairs[-1][0] - 1:+.1%} |")
        (p0, q0), (p1, q1) = pairs[0], pairs[-1]
        print(f"{title} fp8 trend: published {p1 / p0 - 1:+.1%}, predicted {q1 / q0 - 1:+.1%}")


if __name__ == "__main__":
    main()
