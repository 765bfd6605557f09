"""fp8's step time, analytic against the compiled program, on shapes the fp8 calibration
did not compile (docs/planner.md, "fp8's quantisation traffic").

For Llama 7b and GPT-NeoX 2.7b (6 layers, 4096 tokens, sdp=8 on 8 H100s, remat full, as
``tests/jaxsmp/test_plan_compiled_time.py``) it compiles the step in bf16 and fp8 with
XLA:GPU deviceless and prints the analytic compute against the roofline over each
program, and for fp8 also without its quantisation traffic (``FP8_QUANTISE_BYTES`` at 0).
``--conversion`` instead prints what reducing gradients in float32 adds per layer to a
bf16 step (GPT-NeoX 1.3b, 2048 tokens, 4 and 8 layers, as ``calibrate --fp8``), the cost
the time model prices for no precision.

    python bench/plan_fp8_compiled.py [--conversion]      # a few minutes on 2 cores
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from unittest import mock

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jaxsmp
from jaxsmp.plan import Candidate, Workload, cluster, estimate_time, throughput
from jaxsmp.plan.calibrate import DEPTHS, SEQ
from jaxsmp.plan.calibration import HBM_EFFICIENCY
from jaxsmp.plan.compiled import compile_candidate
from jaxsmp.plan.compiled_time import compiled_time
from jaxsmp.plan.gpu_preflight import _topology

SHAPES = {"llama": "7b", "gpt_neox": "2.7b"}
TARGET = cluster("p5.48xlarge", 1)


def kernels(config, candidate: Candidate, seq: int):
    compiled = compile_candidate(config, candidate, seq, _topology("H100-SXM", 8))
    return compiled_time(compiled, TARGET.node.gpu, candidate.precision, TARGET).kernels


def compute_rows() -> None:
    print("| model | precision | compiled compute s | analytic | error | without the casts |")
    print("|---|---|---|---|---|---|")
    for family, preset in SHAPES.items():
        config = jaxsmp.models.preset(family, preset, num_hidden_layers=6)
        w = Workload(config, 4096)
        for precision in ("bf16", "fp8"):
            c = Candidate(1, 8, 1, 1, 1, 2, "full", precision)
            compiled = kernels(config, c, 4096).compute
            step = estimate_time(w, c, TARGET)
            analytic = step.compute + step.optimizer
            without = ""
            if precision == "fp8":
                with mock.patch.object(throughput, "FP8_QUANTISE_BYTES", 0.0):
                    bare = estimate_time(w, c, TARGET)
                without = f"{(bare.compute + bare.optimizer) / compiled - 1:+.1%}"
            print(f"| {family} {preset} | {precision} | {compiled:.4f} | {analytic:.4f} | "
                  f"{analytic / compiled - 1:+.1%} | {without} |", flush=True)


def conversion() -> None:
    seconds = {}
    for depth in DEPTHS:
        config = jaxsmp.models.preset("gpt_neox", "1.3b", num_hidden_layers=depth)
        for reduce in ("bf16", "fp32"):
            k = kernels(config, Candidate(1, 8, 1, 1, 1, 1, "none", "bf16",
                                          reduce_dtype=reduce), SEQ)
            seconds[depth, reduce] = k.memory + k.launch
    per_layer = ((seconds[DEPTHS[1], "fp32"] - seconds[DEPTHS[1], "bf16"])
                 - (seconds[DEPTHS[0], "fp32"] - seconds[DEPTHS[0], "bf16"])) / (
                     DEPTHS[1] - DEPTHS[0])
    params = Workload(config, SEQ).layer_matmul_params
    nbytes = per_layer * TARGET.node.gpu.hbm_bandwidth * HBM_EFFICIENCY
    print(f"float32 gradient reduction adds {per_layer * 1e3:.3f} ms a layer of GPT-NeoX "
          f"1.3b per microbatch on an H100: {nbytes / params:.1f} bytes a parameter")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--conversion", action="store_true",
                   help="the float32 gradient conversion's cost instead")
    conversion() if p.parse_args().conversion else compute_rows()


if __name__ == "__main__":
    main()
