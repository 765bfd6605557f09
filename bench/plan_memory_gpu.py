"""The planner's memory model against XLA:GPU's compiled temporaries of the step as it is.

Compiles ``jaxsmp.step`` deviceless for 8 x H100 (``jaxsmp.plan.gpu_target``) with the
XLA flags jaxsmp sets on GPUs (so, as on a GPU, jaxsmp's own prefetch is off and XLA
pipelines the layer loop's gathers and reduce-scatters), bf16, sdp=8, and prints
``memory_analysis().temp_size_in_bytes`` beside ``estimate_memory(..., backend="gpu")``
in MiB, for each shape, remat and gradient reduction dtype (docs/planner.md's table).
About 30 s of compiling per row on 2 cores.

    python bench/plan_memory_gpu.py                 # the table's rows
    python bench/plan_memory_gpu.py --reduce bf16   # only bf16 reduction
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# this folder's collectives.py would shadow the package of that name
_BENCH = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != _BENCH]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from jaxsmp import xla_flags  # noqa: E402

os.environ["XLA_FLAGS"] = xla_flags.merged(os.environ.get("XLA_FLAGS", ""),
                                           xla_flags.overlap_flags())

# (model, seq, sequences per GPU, remat, reduce_dtype[, layers]): GPT-NeoX-20B at 2048
# tokens per GPU runs its MLP and head with activation gathering (the step's auto)
CASES = [("gpt_neox:20b", 2048, 1, "full", "bf16", 4),
         ("gpt_neox:20b", 2048, 1, "none", "bf16", 4),
         ("gpt_neox:1.3b", 2048, 4, "full", "bf16"), ("gpt_neox:1.3b", 2048, 4, "full", "fp32"),
         ("gpt_neox:1.3b", 2048, 4, "none", "bf16"), ("gpt_neox:1.3b", 2048, 10, "none", "bf16"),
         ("llama:7b", 4096, 1, "full", "bf16"), ("llama:7b", 4096, 1, "full", "fp32"),
         ("llama:7b", 4096, 1, "none", "bf16"), ("llama:7b", 4096, 1, "none", "fp32")]
MiB = 1 << 20


def row(model: str, seq: int, mbs: int, remat: str, reduce: str, layers: int = 0) -> str:
    from jaxsmp.plan import Candidate
    from jaxsmp.plan.compiled import compile_candidate, memory_of
    from jaxsmp.plan.gpu_preflight import _topology
    from jaxsmp.plan.memory import estimate_memory
    from jaxsmp.plan.search import load_model
    from jaxsmp.plan.workload import Workload
    c = Candidate(1, 8, 1, 1, mbs, 1, remat, "bf16", reduce_dtype=reduce)
    config = load_model(model)
    if layers:
        config = config.replace(num_hidden_layers=layers)
    compiled = memory_of(compile_candidate(config, c, seq, devices=_topology("H100-SXM", 8)))
    m = estimate_memory(Workload(config, seq), c, backend="gpu")
    name = f"{model} x{layers}" if layers else model
    return (f"| {name} seq {seq}, {mbs} seq/GPU, remat {remat}, reduce {reduce} | "
            f"{m.temporaries / MiB:,.0f} ({m.phase}) | {compiled.temporaries / MiB:,.0f} | "
            f"{m.temporaries / compiled.temporaries - 1:+.1%} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reduce", nargs="+", default=["bf16", "fp32"], choices=("bf16", "fp32"))
    p.add_argument("--only", help="the rows whose model contains this, e.g. 20b")
    args = p.parse_args()
    print("| shape (8 x H100, sdp=8, bf16) | model MiB (peak at) | compiled MiB | error |\n"
          "|---|---|---|---|", flush=True)
    for case in CASES:
        if case[4] in args.reduce and (args.only is None or args.only in case[0]):
            print(row(*case), flush=True)


if __name__ == "__main__":
    main()
