"""What jaxsmp's GPU overlap flags (``jaxsmp/xla_flags.py``) cost in XLA:GPU memory.

Compiles a plan deviceless for 8 H100s (``jaxsmp.plan.gpu_preflight``) twice, in fresh
processes: without the flags (as the tests and ``bench/gpu_compile.py`` compile, with
``JAX_PLATFORMS=cpu`` set before jaxsmp is imported) and with them (as a GPU run, and
the plan CLI's pre-flight, compile). Prints compiled temporaries beside the memory model.

    python bench/xla_flags_memory.py
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = [("gpt_neox:1.3b", 2048, "Candidate(1, 8, 1, 1, 4, 1, 'full', 'bf16')"),
         ("llama:7b", 32768, "Candidate(1, 1, 1, 1, 1, 8, 'none', 'bf16', cp=8)")]
CHILD = """
import os, sys
if sys.argv[1] == "with":
    from jaxsmp.xla_flags import overlap_flags
    os.environ["XLA_FLAGS"] = " ".join(overlap_flags())
from jaxsmp.plan.candidate import Candidate
from jaxsmp.plan.gpu_preflight import gpu_preflight
r = gpu_preflight(sys.argv[2], eval(sys.argv[4]), int(sys.argv[3]), "H100-SXM")
print(f"| {sys.argv[2]} seq {sys.argv[3]} | {r.candidate.label()} | {sys.argv[1]} flags | "
      f"{r.compiled.temporaries / 2**30:.2f} | {r.predicted.temporaries / 2**30:.2f} | "
      f"{100 * r.error:+.1f}% |")
"""


def main() -> int:
    print("| model | plan | | compiled temporaries GiB | model GiB | model vs compiled peak |\n"
          "|---|---|---|---|---|---|", flush=True)
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    env.pop("XLA_FLAGS", None)
    for model, seq, candidate in CASES:
        for flags in ("without", "with"):
            run = subprocess.run([sys.executable, "-c", CHILD, flags, model, str(seq), candidate],
                                 env=env, capture_output=True, text=True)
            rows = [l for l in run.stdout.splitlines() if l.startswith("|")]
            print(rows[0] if rows else f"| {model} | failed: {run.stderr[-500:]} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
