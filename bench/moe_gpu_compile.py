"""The Mixtral 8x7b width (2 layers) compiled deviceless by XLA:GPU for 8 x H100 (bf16,
remat full, one 4096-token sequence per GPU) on ``sdp=8`` and ``sdp=4, tp=2`` (no ``ep``:
expert parallelism is not implemented): temporaries, the kernels (custom calls and GEMM
fusion kinds), the GEMMs the router's grouped ``ragged_dot`` became, with their
contraction, and the collectives.

    python bench/moe_gpu_compile.py       # needs jax-cuda12-plugin of jaxlib's version
"""
from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

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
from jaxsmp.plan import gpu_target

GEMM = re.compile(r"^%(\S+) \(parameter_\S+: (\w+\[[\d,]+\]), parameter_\S+: (\w+\[[\d,]+\])\)"
                  r" -> (\w+\[[\d,]+\])")


def ragged_gemms(text: str) -> collections.Counter:
    """``lhs @ rhs -> out`` shapes of the GEMM fusions XLA made of ragged_dot."""
    found = collections.Counter()
    for block in text.split("\n\n"):
        head = GEMM.match(block)
        if head and "ragged_dot_general" in block:
            found[f"{head.group(2)} @ {head.group(3)} -> {head.group(4)}"] += 1
    return found


def main() -> None:
    cfg = preset("mixtral", "8x7b", num_hidden_layers=2)
    devices = gpu_target.topology("H100-SXM", gpus_per_host=8)
    for shape in (dict(sdp=8), dict(sdp=4, tp=2)):
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
        print(f"collectives {dict(collectives)}\n")


if __name__ == "__main__":
    main()
