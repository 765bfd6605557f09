"""The Mixtral 8x7b width (2 layers) compiled deviceless by XLA:GPU for 8 x H100 (bf16,
remat full, one 4096-token sequence per GPU) on ``ep=8``, ``ep=4, tp=2``, ``sdp=8`` and
``sdp=4, tp=2``: temporaries, the kernels (custom calls and GEMM fusion kinds), the GEMMs
the experts' grouped ``ragged_dot`` became, with their contraction, and the bytes per GPU
through each kind of collective (``jaxsmp.plan.hlo_cost``: a loop body's collectives
times its trip count), the all-to-all of the token dispatch among them.

    python bench/moe_gpu_compile.py [--mesh ep=8 sdp=8]   # needs jax-cuda12-plugin of jaxlib's version
"""
from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import collections
import re
import sys
import time

import jax
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jaxsmp
from jaxsmp.checkpoint import abstract_state
from jaxsmp.losses import causal_lm_loss
from jaxsmp.models import preset
from jaxsmp.plan import gpu_target, hlo_cost
from jaxsmp.plan.compiled_time import rates
from jaxsmp.plan.hardware import GPUS

MESHES = ("ep=8", "ep=4,tp=2", "sdp=8", "sdp=4,tp=2")

# a GEMM fusion's head; XLA names its parameters parameter_N (jax 0.10, 0.11) or param_N.M
GEMM = re.compile(r"^%(\S+) \(param\w*\S*: (\w+\[[\d,]+\]), param\w*\S*: (\w+\[[\d,]+\])\)"
                  r" -> (\w+\[[\d,]+\])")


def ragged_gemms(text: str) -> collections.Counter:
    """``lhs @ rhs -> out`` shapes of the GEMM fusions XLA made of ragged_dot."""
    found = collections.Counter()
    for block in text.split("\n\n"):
        head = GEMM.match(block)
        if head and "ragged_dot_general" in block:
            found[f"{head.group(2)} @ {head.group(3)} -> {head.group(4)}"] += 1
    return found


def collective_gib(text: str) -> dict[str, float]:
    """GiB per GPU through each kind of collective (and dtype) in one step."""
    found: collections.Counter = collections.Counter()
    for c in hlo_cost.estimate(text, rates(GPUS["H100-SXM"], "bf16")).collectives:
        if c.group_size > 1:
            found[f"{c.kind} {c.dtype}"] += c.nbytes * c.count / 2**30
    return {k: round(v, 3) for k, v in sorted(found.items())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mesh", nargs="+", default=list(MESHES))
    args = parser.parse_args()
    cfg = preset("mixtral", "8x7b", num_hidden_layers=2)
    devices = gpu_target.topology("H100-SXM", gpus_per_host=8)
    for text_shape in args.mesh:
        shape = {k: int(v) for k, v in (p.split("=") for p in text_shape.split(","))}
        start = time.perf_counter()
        mesh = jaxsmp.Mesh(**shape, devices=devices)
        state = abstract_state(cfg.build, optax.adamw(1e-4), mesh)
        step = jaxsmp.step(causal_lm_loss, precision="bf16", remat="full")
        tokens = {"tokens": jax.ShapeDtypeStruct((8, 4096), np.int32)}
        compiled = gpu_target.compile_step(step, state, tokens, mesh)
        text, memory = compiled.as_text(), compiled.memory_analysis()
        print(f"## {shape}: compiled in {time.perf_counter() - start:.0f} s, temporaries "
              f"{memory.temp_size_in_bytes / 2**30:.2f} GiB, arguments "
              f"{memory.argument_size_in_bytes / 2**30:.2f} GiB")
        calls = collections.Counter(re.findall(r'custom_call_target="([^"]+)"', text))
        kinds = collections.Counter(re.findall(r'"kind":"([^"]+)"', text))
        print(f"custom calls {dict(calls)}; fusion kinds {dict(kinds)}")
        print(f"ragged-dot ops left: {text.count(' ragged-dot(')}; its GEMMs:")
        for gemm, n in ragged_gemms(text).most_common():
            print(f"  {n} x {gemm}")
        collectives = collections.Counter(re.findall(
            r" (all-gather|reduce-scatter|all-reduce|all-to-all|collective-permute)"
            r"(?:-start)?\(", text))
        print(f"collectives {dict(collectives)}")
        print(f"collective GiB per GPU {collective_gib(text)}\n", flush=True)


if __name__ == "__main__":
    main()
