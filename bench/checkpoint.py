"""Checkpoint save/restore time and size for a GPT-NeoX preset on 8 simulated CPU
devices, and how long training is blocked by an async save vs a synchronous one.
Prints a markdown table.

    python bench/checkpoint.py [--preset 125m] [--dir /tmp/jaxsmp-ckpt-bench]

"Blocked" is the wall time of the ``save()`` call, during which the training loop
cannot dispatch its next step. The async save then finishes writing in the
background; the step time measured while it writes shows what that costs the
(CPU-simulated) training, whose compute shares the host with the writer threads.
"""
from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import shutil
import sys
import time
from pathlib import Path

# bench/collectives.py would shadow the ``collectives`` package jaxsmp imports.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import jaxsmp  # noqa: E402
from jaxsmp.checkpoint import CheckpointManager, abstract_state, describe_model  # noqa: E402
from jaxsmp.losses import causal_lm_loss  # noqa: E402
from jaxsmp.models import count_params, preset  # noqa: E402


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def batch(rng: np.random.Generator, vocab: int, size: int, seq: int) -> dict:
    return {"tokens": rng.integers(0, vocab, (size, seq), dtype=np.int32)}


def run_step(train_step, state, b):
    state, metrics = train_step(state, b)
    jax.block_until_ready(metrics["loss"])
    return state


def saves(state, root: Path, model) -> list[tuple]:
    """Table rows: a synchronous save (the loop waits for the whole write) and an
    asynchronous one with nothing else running (how long the background write takes)."""
    with CheckpointManager(root / "sync", async_save=False, model=model) as ckpt:
        _, t_sync = timed(lambda: ckpt.save(state, force=True))
    with CheckpointManager(root / "async", async_save=True, model=model) as ckpt:
        _, t_blocked = timed(lambda: ckpt.save(state, force=True))
        _, t_rest = timed(ckpt.wait)
    return [("save, synchronous", t_sync, t_sync, du(root / "sync")),
            ("save, async", t_blocked, t_blocked + t_rest, du(root / "async"))]


def restores(cfg, tx, mesh, directory: Path, model) -> list[tuple]:
    """Table rows: restoring the checkpoint in ``directory`` onto the same mesh, another
    layout, and half the devices."""
    rows = []
    for name, m in [("restore, same mesh (sdp=8)", mesh),
                    ("restore, resharded (sdp=4, tp=2)", jaxsmp.Mesh(sdp=4, tp=2)),
                    ("restore, 4 devices (sdp=4)", jaxsmp.Mesh(sdp=4, devices=jax.devices()[:4]))]:
        template = abstract_state(cfg.build, tx, m)
        with CheckpointManager(directory, model=model) as ckpt:
            restored, t = timed(lambda: jax.block_until_ready(ckpt.restore(template)))
        rows.append((name, t, t, None))
        del restored
    return rows


def print_table(rows: list[tuple], state_bytes: int) -> None:
    print("| operation | training blocked (s) | wall time (s) | bytes written | state GB/s |")
    print("|---|---|---|---|---|")
    for name, blocked, total, nbytes in rows:
        size = f"{nbytes / 2**30:.2f} GiB ({nbytes:,})" if nbytes else "-"
        blocked_s = f"{blocked:.2f}" if name.startswith("save") else "-"
        print(f"| {name} | {blocked_s} | {total:.2f} | {size} | "
              f"{state_bytes / total / 1e9:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="125m")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--dir", default="/tmp/jaxsmp-ckpt-bench")
    args = parser.parse_args()
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)

    cfg = preset("gpt_neox", args.preset)
    model = describe_model(cfg, family="gpt_neox", preset=args.preset)
    tx = optax.adamw(1e-4)
    mesh = jaxsmp.Mesh(sdp=8)
    state, t_init = timed(lambda: jax.block_until_ready(jaxsmp.init(cfg.build, tx, mesh)))
    state_bytes = sum(x.nbytes for x in jax.tree.leaves(state))
    print(f"{args.preset}: {count_params(cfg) / 1e6:.1f}M params, state "
          f"{state_bytes / 2**30:.2f} GiB (params + AdamW moments), init {t_init:.1f}s",
          flush=True)

    train_step = jaxsmp.step(causal_lm_loss)
    rng = np.random.default_rng(0)
    b = batch(rng, cfg.vocab_size, args.batch_size, args.seq_len)
    state, t_compile = timed(lambda: run_step(train_step, state, b))
    steps = []
    for _ in range(2):
        state, t = timed(lambda: run_step(train_step, state, b))
        steps.append(t)
    step_time = min(steps)
    print(f"first step (compile) {t_compile:.1f}s, step {step_time:.2f}s", flush=True)

    rows = saves(state, root, model)
    # Async save while training on: one step runs during the background write (and
    # donates the state being written); the checkpoint must still hold the old state.
    saved = [np.array(x) for x in jax.tree.leaves(state)]
    with CheckpointManager(root / "overlap", async_save=True, model=model) as ckpt:
        _, t_blocked2 = timed(lambda: ckpt.save(state, force=True))
        state, t_step_during = timed(lambda: run_step(train_step, state, b))
        _, t_tail = timed(ckpt.wait)
    state, t_step_after = timed(lambda: run_step(train_step, state, b))
    step_time = min(step_time, t_step_after)
    with CheckpointManager(root / "overlap", model=model) as ckpt:
        back = jax.tree.leaves(ckpt.restore(abstract_state(cfg.build, tx, mesh)))
    intact = all(np.array_equal(a, np.asarray(x)) for a, x in zip(saved, back))
    del saved, back

    rows += restores(cfg, tx, mesh, root / "sync", model)
    print(f"\nGPT-NeoX {args.preset} ({count_params(cfg) / 1e6:.0f}M params), 8 simulated CPU "
          f"devices, state {state_bytes / 2**30:.2f} GiB (float32 params + AdamW moments)\n")
    print_table(rows, state_bytes)
    print(f"\nTrain step (batch {args.batch_size}x{args.seq_len}): {step_time:.2f}s alone; "
          f"{t_step_during:.2f}s while an async save wrote in the background (save call "
          f"blocked {t_blocked2:.2f}s, write finished {t_tail:.2f}s after the step); "
          f"that checkpoint restores bitwise equal to the state saved: {intact}.")
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
