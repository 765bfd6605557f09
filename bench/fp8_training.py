"""Tiny GPT-NeoX and Llama trained in fp8 and in bf16 side by side on CPU (JAX emulates
the float8 dots): the loss curves, their gap over the last steps, and a PNG plot.

Both precisions see the same initial weights and the same batches (the default corpus,
byte tokens); a third run in bf16 from another initialisation seed shows how far apart
two bf16 runs that differ only by chance end up, the scale against which the fp8 gap
is judged. One CPU device, AdamW.

    python bench/fp8_training.py [--steps 200] [--families gpt_neox llama]
                                 [--plot docs/img/fp8_vs_bf16.png]
"""
from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import sys
import time
from pathlib import Path

# bench/collectives.py would shadow the ``collectives`` package jaxsmp imports.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import jaxsmp  # noqa: E402
from jaxsmp.data import ByteTokenizer, TokenBatches, load_corpus  # noqa: E402
from jaxsmp.losses import causal_lm_loss  # noqa: E402

BATCH, SEQ, LR = 16, 64, 1e-3
# fp8's mean |loss - bf16's| over the last 50 of 200 steps, relative to bf16's: measured
# 0.43% (gpt_neox) and 0.85% (llama), while bf16 from another seed lands 0.99% and 1.35%
# away; above 2% fp8 would move training further than a new initialisation does.
TOLERANCE = 0.02


def loss_curve(family: str, precision: str, steps: int, seed: int = 0, batch: int = BATCH,
               seq: int = SEQ, lr: float = LR) -> list[float]:
    """The training losses of ``steps`` steps of the tiny ``family`` preset on one
    device; batches depend on the step number only, weights on ``seed``."""
    data = TokenBatches(ByteTokenizer().encode(load_corpus(None)), batch, seq, seed=0)
    mesh = jaxsmp.Mesh(sdp=1, devices=jax.devices()[:1])
    state = jaxsmp.init(jaxsmp.models.preset(family, "tiny").build, optax.adamw(lr), mesh,
                        seed=seed)
    train_step = jaxsmp.step(causal_lm_loss, precision=precision)
    losses = []
    for i in range(steps):
        state, metrics = train_step(state, data.batch(i))
        losses.append(float(metrics["loss"]))
    return losses


def tail_gap(a: list[float], b: list[float], tail: int) -> float:
    """Mean ``|a - b|`` over the last ``tail`` steps, relative to ``b``'s mean there."""
    a, b = np.asarray(a[-tail:]), np.asarray(b[-tail:])
    return float(np.mean(np.abs(a - b)) / np.mean(b))


def measure(families: list[str], steps: int) -> dict[str, dict[str, list[float]]]:
    curves = {}
    for family in families:
        curves[family] = {}
        for name, precision, seed in (("bf16", "bf16", 0), ("fp8", "fp8", 0),
                                      ("bf16 seed 1", "bf16", 1)):
            start = time.perf_counter()
            curves[family][name] = loss_curve(family, precision, steps, seed)
            print(f"{family} {name}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return curves


def print_table(curves: dict, tail: int) -> None:
    print(f"| model | steps | bf16 first -> last | fp8 last | fp8 vs bf16, last {tail} "
          f"| bf16 seed 1 vs seed 0, last {tail} | max abs(fp8 - bf16), any step "
          f"| within {100 * TOLERANCE:g}% |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for family, c in curves.items():
        bf16, fp8, other = c["bf16"], c["fp8"], c["bf16 seed 1"]
        worst = float(np.max(np.abs(np.asarray(fp8) - np.asarray(bf16))))
        print(f"| {family} tiny | {len(bf16)} | {bf16[0]:.3f} -> {bf16[-1]:.3f} | "
              f"{fp8[-1]:.3f} | {100 * tail_gap(fp8, bf16, tail):.2f}% | "
              f"{100 * tail_gap(other, bf16, tail):.2f}% | {worst:.3f} | "
              f"{'yes' if tail_gap(fp8, bf16, tail) <= TOLERANCE else 'NO'} |")


def plot(curves: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(curves), figsize=(6 * len(curves), 4), squeeze=False)
    for ax, (family, c) in zip(axes[0], curves.items()):
        for name, style in (("bf16", "-"), ("fp8", "--"), ("bf16 seed 1", ":")):
            ax.plot(np.arange(1, len(c[name]) + 1), c[name], style, label=name, linewidth=1)
        ax.set(title=f"{family} tiny, one CPU device", xlabel="step", ylabel="training loss")
        ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    print(f"plot: {path}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--tail", type=int, default=50, help="steps the gap is averaged over")
    parser.add_argument("--families", nargs="+", default=["gpt_neox", "llama"])
    parser.add_argument("--plot", default="docs/img/fp8_vs_bf16.png")
    args = parser.parse_args(argv)
    curves = measure(args.families, args.steps)
    print_table(curves, args.tail)
    if args.plot:
        plot(curves, args.plot)


if __name__ == "__main__":
    main()
