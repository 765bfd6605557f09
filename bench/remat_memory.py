"""Compiled temporary memory per layer of the training step, by remat policy.

The growth of ``memory_analysis().temp_size_in_bytes`` from 4 to 12 layers,
divided by 8, is what each extra layer keeps alive for the backward pass (activations
only, never the gathered layer). ``--prefetch``: instead, what prefetching
the next layer costs (temporaries with ``prefetch`` on and off) on W0 at seq 128.

    python bench/remat_memory.py [--hidden 256] [--sdp 8] [--prefetch]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8"
                           + " --xla_cpu_experimental_ynn_fusion_type=").strip()
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `collectives` the package

import jax
import numpy as np
import optax

import jaxsmp
from jaxsmp.checkpoint import abstract_state
from jaxsmp.losses import causal_lm_loss
from jaxsmp.nn.remat import POLICIES


def temp_bytes(hidden: int, layers: int, sdp: int, remat: str) -> int:
    cfg = jaxsmp.models.preset("gpt_neox", "tiny", hidden_size=hidden, num_hidden_layers=layers,
                               intermediate_size=4 * hidden, attention_impl="reference")
    state = jaxsmp.init(cfg.build, optax.adamw(1e-3), jaxsmp.Mesh(sdp=sdp, collectives="xla"))
    lowered = jaxsmp.step(causal_lm_loss, remat=remat).lower(
        state, {"tokens": np.zeros((16, 64), np.int32)})
    return lowered.compile().memory_analysis().temp_size_in_bytes


def prefetch_temp_bytes(degrees: dict, microbatches: int, prefetch: bool) -> int:
    """W0-like (4 layers, d=256, MLP 1024, vocab 1024), seq 128, batch 16, remat full."""
    cfg = jaxsmp.models.preset("gpt_neox", "tiny", hidden_size=256, num_attention_heads=4,
                               intermediate_size=1024, vocab_size=1024,
                               attention_impl="blockwise")
    state = abstract_state(cfg.build, optax.adamw(1e-4),
                           jaxsmp.Mesh(**degrees, collectives="xla"))
    step = jaxsmp.step(causal_lm_loss, microbatches=microbatches, remat="full",
                       prefetch=prefetch)
    batch = {"tokens": jax.ShapeDtypeStruct((16, 128), np.int32)}
    return step.lower(state, batch).compile().memory_analysis().temp_size_in_bytes


def prefetch_table() -> None:
    print("| mesh | microbatches | temp MiB, prefetch off | temp MiB, on | cost MiB |")
    print("|---|---|---|---|---|")
    for degrees, microbatches in ((dict(sdp=8), 1), (dict(dp=2, sdp=4), 2)):
        off, on = (prefetch_temp_bytes(degrees, microbatches, p) / 2**20 for p in (False, True))
        print(f"| {degrees} | {microbatches} | {off:.2f} | {on:.2f} | {on - off:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--sdp", type=int, default=8)
    parser.add_argument("--prefetch", action="store_true")
    args = parser.parse_args()
    if args.prefetch:
        return prefetch_table()
    layer_mb = 12 * args.hidden ** 2 * 4 / 1e6
    print(f"one gathered layer: {layer_mb:.2f} MB (float32)\n")
    print("| remat | temp MB, 4 layers | temp MB, 12 layers | MB per extra layer |")
    print("|---|---|---|---|")
    for policy in POLICIES:
        small, large = (temp_bytes(args.hidden, n, args.sdp, policy) / 1e6 for n in (4, 12))
        print(f"| {policy} | {small:.1f} | {large:.1f} | {(large - small) / 8:.2f} |")


if __name__ == "__main__":
    main()
