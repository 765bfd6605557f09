"""Context parallelism on 8 simulated CPU devices: tokens/s and temporaries of Ulysses and
ring attention beside no context parallelism, at sequence lengths 2k to 32k.

The same model (tiny GPT-NeoX, 2 layers, remat full, blockwise attention) and the same
global batch (8 sequences) on the same 8 devices: ``cp=1`` (``sdp=8``: one whole
sequence per device) against ``cp=4, sdp=2`` with each strategy (four quarter sequences
per device). The contenders alternate step by step; the table gives the median seconds
per step, tokens/s relative to ``cp=1`` and XLA's per-device temporaries. Above
``--max-timed`` tokens only the compiled memory is reported (a CPU step there takes
minutes). XLA:CPU runs collectives in line and the simulated devices share the host's
cores, so the ratios show the extra work each strategy does, not the overlap a GPU gets.

    python bench/context_parallel.py [--seqs 2048 8192 32768] [--steps 3] [--max-timed 8192]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import jaxsmp  # noqa: E402

BATCH = 8
CONTENDERS = {"cp=1 (sdp=8)": (dict(sdp=8), "auto"),
              "cp=4 ulysses": (dict(cp=4, sdp=2), "ulysses"),
              "cp=4 ring": (dict(cp=4, sdp=2), "ring")}


def setup(seq: int, degrees: dict, strategy: str):
    config = jaxsmp.models.preset("gpt_neox", "tiny", num_hidden_layers=2,
                                  max_position_embeddings=seq, attention_impl="blockwise")
    mesh = jaxsmp.Mesh(**degrees)
    state = jaxsmp.init(config.build, optax.adamw(1e-3), mesh)
    step = jaxsmp.step(jaxsmp.losses.causal_lm_loss, remat="full",
                       **({"context_parallel": strategy} if degrees.get("cp", 1) > 1 else {}))
    tokens = {"tokens": np.random.default_rng(0).integers(0, 256, (BATCH, seq), np.int32)}
    temporaries = step.lower(state, tokens).compile().memory_analysis().temp_size_in_bytes
    return step, state, tokens, temporaries


def measure(seq: int, steps: int, timed: bool) -> dict:
    runs = {name: setup(seq, *spec) for name, spec in CONTENDERS.items()}
    seconds = {name: [] for name in runs}
    for name, (step, state, tokens, _) in runs.items() if timed else []:
        state, _ = step(state, tokens)  # compile and warm up
        runs[name] = (step, state, tokens, runs[name][3])
    for _ in range(steps if timed else 0):
        for name, (step, state, tokens, mem) in runs.items():  # alternate contenders
            start = time.perf_counter()
            state, metrics = step(state, tokens)
            jax.block_until_ready(metrics["loss"])
            seconds[name].append(time.perf_counter() - start)
            runs[name] = (step, state, tokens, mem)
    return {name: (statistics.median(seconds[name]) if seconds[name] else None, run[3])
            for name, run in runs.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seqs", type=int, nargs="+", default=[2048, 8192, 32768])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--max-timed", type=int, default=8192)
    args = p.parse_args(argv)
    print(f"jax {jax.__version__}, 8 simulated CPU devices, tiny GPT-NeoX x 2 layers, "
          f"batch {BATCH}, remat full, median of {args.steps} alternating steps")
    print("| seq | contender | s/step | tokens/s vs cp=1 | temporaries MiB | vs cp=1 |\n"
          "|---|---|---|---|---|---|")
    for seq in args.seqs:
        rows = measure(seq, args.steps, seq <= args.max_timed)
        base_s, base_mem = rows["cp=1 (sdp=8)"]
        for name, (s, mem) in rows.items():
            speed = f"{base_s / s:.2f}x" if s else "-"
            print(f"| {seq} | {name} | {f'{s:.2f}' if s else '-'} | {speed} | "
                  f"{mem / 2**20:.0f} | {mem / base_mem:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
