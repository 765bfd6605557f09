"""Tiny GPT-NeoX and Llama trained on ``sdp=8`` (8 simulated CPU devices) with the
gradient reduce-scatter in float32 and in bfloat16 (``reduce_dtype``), side by side: the
loss curves and their gap over the last steps. bf16 compute in both; a third run
(float32 reduction, another initialisation seed) gives the scale of chance.

XLA:CPU sums a bf16 collective in float32 and rounds the result: the bf16 run here sees
each device's gradient rounded to bf16 and the sum rounded once, as NCCL's bf16 ring
sums round at each of its ``p - 1`` steps on GPUs.

    python bench/reduce_dtype_training.py [--steps 200] [--families gpt_neox llama]
"""
from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()

import argparse
import sys
import time
from pathlib import Path

# bench/collectives.py would shadow the ``collectives`` package jaxsmp imports.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import numpy as np  # noqa: E402
import optax  # noqa: E402

import jaxsmp  # noqa: E402
from jaxsmp.data import ByteTokenizer, TokenBatches, load_corpus  # noqa: E402
from jaxsmp.losses import causal_lm_loss  # noqa: E402

sys.path.append(str(Path(__file__).resolve().parent))  # collectives is imported by now
from fp8_training import tail_gap  # noqa: E402

BATCH, SEQ, LR = 16, 64, 1e-3
RUNS = (("fp32", "fp32", 0), ("bf16", "bf16", 0), ("fp32 seed 1", "fp32", 1))


def loss_curve(family: str, reduce_dtype: str, steps: int, seed: int = 0) -> list[float]:
    """Training losses of the tiny ``family`` preset on ``sdp=8``; batches depend on the
    step number only, weights on ``seed``."""
    data = TokenBatches(ByteTokenizer().encode(load_corpus(None)), BATCH, SEQ, seed=0)
    mesh = jaxsmp.Mesh(sdp=8)
    state = jaxsmp.init(jaxsmp.models.preset(family, "tiny").build, optax.adamw(LR), mesh,
                        seed=seed)
    train_step = jaxsmp.step(causal_lm_loss, precision="bf16", reduce_dtype=reduce_dtype)
    losses = []
    for i in range(steps):
        state, metrics = train_step(state, data.batch(i))
        losses.append(float(metrics["loss"]))
    return losses


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--tail", type=int, default=50)
    parser.add_argument("--families", nargs="+", default=["gpt_neox", "llama"])
    args = parser.parse_args(argv)
    print(f"| model | steps | fp32 reduce first -> last | bf16 reduce last | bf16 vs fp32, "
          f"last {args.tail} | seed 1 vs seed 0, last {args.tail} | max abs(bf16 - fp32) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for family in args.families:
        curves = {}
        for name, reduce_dtype, seed in RUNS:
            start = time.perf_counter()
            curves[name] = loss_curve(family, reduce_dtype, args.steps, seed)
            print(f"{family} {name}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
        fp32, bf16, other = curves["fp32"], curves["bf16"], curves["fp32 seed 1"]
        worst = float(np.max(np.abs(np.asarray(bf16) - np.asarray(fp32))))
        print(f"| {family} tiny | {args.steps} | {fp32[0]:.3f} -> {fp32[-1]:.3f} | "
              f"{bf16[-1]:.3f} | {100 * tail_gap(bf16, fp32, args.tail):.2f}% | "
              f"{100 * tail_gap(other, fp32, args.tail):.2f}% | {worst:.3f} |", flush=True)


if __name__ == "__main__":
    main()
