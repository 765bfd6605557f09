"""Compiled temporary memory and wall time of attention forward+backward, reference vs
blockwise, on one CPU device. Prints a markdown table.

    python bench/attention_memory.py [--seqs 1024 2048 ...] [--max-temp-gib 6]

The reference is always compiled (so its temp size is reported) but only run while its
temp buffer stays under --max-temp-gib; bigger ones are marked "not run".
"""
from __future__ import annotations

import os

# Before importing jax: XLA:CPU's YNN fusions hide buffers from memory_analysis, and a
# single host device keeps the numbers comparable to one accelerator.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_cpu_experimental_ynn_fusion_type=").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pallas_kernels import attention

HEADS, HEAD_DIM = 8, 64
GIB = 2 ** 30


def forward_backward(impl: str):
    """jit of (q, k, v, cotangent) -> (out, dq, dk, dv) for causal attention."""
    def f(q, k, v, cotangent):
        out, vjp = jax.vjp(lambda q, k, v: attention(q, k, v, causal=True, impl=impl), q, k, v)
        return (out, *vjp(cotangent))
    return jax.jit(f)


def inputs(seq: int) -> list[jax.Array]:
    keys = jax.random.split(jax.random.key(seq), 4)
    return [jax.random.normal(key, (1, seq, HEADS, HEAD_DIM), jnp.float32) for key in keys]


def median_seconds(compiled, args, runs: int) -> float:
    jax.block_until_ready(compiled(*args))  # warm-up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
        if times[0] > 60 and len(times) >= 3:  # very long runs: three are enough
            break
    return statistics.median(times)


def measure(impl: str, seq: int, runs: int, max_temp: float) -> tuple[int, float | None]:
    args = inputs(seq)
    compiled = forward_backward(impl).lower(*args).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes
    if temp > max_temp:
        return temp, None
    return temp, median_seconds(compiled, args, runs)


def cell(temp: int, seconds: float | None) -> str:
    timing = "not run" if seconds is None else f"{seconds:.3f} s"
    return f"{temp / 2**20:,.1f} MiB | {timing}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, nargs="+",
                        default=[1024, 2048, 4096, 8192, 16384, 32768])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--max-temp-gib", type=float, default=6.0)
    args = parser.parse_args()
    print(f"causal forward+backward, batch 1, {HEADS} heads, head_dim {HEAD_DIM}, float32, "
          f"{jax.devices()[0].device_kind}, median of up to {args.runs} runs\n")
    print("| seq | reference temp | reference time | blockwise temp | blockwise time |")
    print("|---:|---:|---:|---:|---:|")
    for seq in args.seqs:
        ref = measure("reference", seq, args.runs, args.max_temp_gib * GIB)
        blk = measure("blockwise", seq, args.runs, args.max_temp_gib * GIB)
        print(f"| {seq} | {cell(*ref)} | {cell(*blk)} |", flush=True)


if __name__ == "__main__":
    main()
