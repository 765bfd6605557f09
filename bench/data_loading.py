"""Step time with batches from a memory-mapped prepared dataset vs synthetic data
(one batch already on the devices, reused), on 8 simulated CPU devices. Prints a
markdown table of median step times and their ratio to synthetic.

    python bench/data_loading.py [--preset tiny] [--batch-size 32] [--seq-len 256]
                                 [--read-delay-ms 0] [--rounds 5] [--steps 10]

Each time is one loop iteration: getting the batch, then the step until its loss is
ready. Contenders, alternated round by round (each round runs ``--steps`` steps of each):
``synthetic``; ``mmap, prefetch`` (the trainer's path: rows read, packed and put on
the devices by the background thread while the previous step runs); ``mmap,
inline`` (the same work between steps, no overlap). ``--read-delay-ms`` adds a
sleep to every batch read, as a slow disk or network file system would, to show
what the overlap hides.
"""
from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import sys
import tempfile
import time
from pathlib import Path

# bench/collectives.py would shadow the ``collectives`` package jaxsmp imports.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import jaxsmp  # noqa: E402
from jaxsmp.data import PackedBatches, TokenDataset, default_corpus, train_bpe  # noqa: E402
from jaxsmp.data.loader import Prefetcher, device_batch  # noqa: E402
from jaxsmp.data.prepare import prepare  # noqa: E402
from jaxsmp.losses import causal_lm_loss  # noqa: E402


class SlowReads:
    """A source whose every read sleeps ``delay`` seconds first."""

    def __init__(self, source, delay: float):
        self.source, self.delay = source, delay
        self.batch_size, self.seq_len = source.batch_size, source.seq_len

    def rows(self, index, positions):
        time.sleep(self.delay)
        return self.source.rows(index, positions)


def _dataset(directory: Path) -> TokenDataset:
    text = default_corpus()
    tokenizer = train_bpe([text], 1024)
    docs = directory / "docs"
    docs.mkdir()
    for k in range(20):  # ~4.6 MB of text: each batch reads fresh rows for a while
        (docs / f"{k:02d}.txt").write_text(text)
    prepare(tokenizer, sorted(docs.glob("*.txt")), directory / "data", shard_tokens=2 ** 20)
    return TokenDataset(directory / "data")


def _round(train_step, state, batches, steps: int):
    """Wall time of each loop iteration: getting the batch, then the step."""
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        _, batch = next(batches)
        state, metrics = train_step(state, batch)
        jax.block_until_ready(metrics["loss"])
        times.append(time.perf_counter() - start)
    return state, times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--read-delay-ms", type=float, default=0.0)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = _dataset(Path(tmp))
        mesh = jaxsmp.Mesh(sdp=8)
        cfg = jaxsmp.models.preset("gpt_neox", args.preset, vocab_size=1024)
        state = jaxsmp.init(cfg.build, optax.adamw(1e-4), mesh)
        train_step = jaxsmp.step(causal_lm_loss)
        source = SlowReads(PackedBatches(data, "train", args.batch_size, args.seq_len),
                           args.read_delay_ms / 1e3)
        fixed = device_batch(source.source, 0, mesh)
        state, _ = _round(train_step, state, iter(lambda: (0, fixed), None), 2)  # compiles
        start = 0
        synthetic = iter(lambda: (0, fixed), None)
        contenders = {
            "synthetic (one batch on the devices)": lambda s: None,
            "mmap, prefetch (trainer)": lambda s: Prefetcher(source, mesh, range(s, 10 ** 9)),
            "mmap, inline": lambda s: Prefetcher(source, mesh, range(s, 10 ** 9), depth=0),
        }
        times = {name: [] for name in contenders}
        for _ in range(args.rounds):
            for name, make in contenders.items():
                loader = make(start)
                state, t = _round(train_step, state, synthetic if loader is None else iter(loader),
                                  args.steps)
                if loader is not None:
                    loader.close()
                times[name] += t[1:]  # the first step of a round waits for the thread's start
                start += args.steps
        read = [_timed(lambda: device_batch(source, i, mesh)) for i in range(10)]
        _print(args, times, float(np.median(read)))


def _timed(fn) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn())
    return time.perf_counter() - start


def _print(args, times: dict, read: float) -> None:
    base = float(np.median(times["synthetic (one batch on the devices)"]))
    print(f"\n{args.preset}, batch {args.batch_size} x {args.seq_len}, 8 simulated CPU devices; "
          f"read delay {args.read_delay_ms:g} ms; preparing one batch alone: {1e3 * read:.1f} ms")
    print("\n| data | median step (ms) | vs synthetic |\n| --- | ---: | ---: |")
    for name, t in times.items():
        median = float(np.median(t))
        print(f"| {name} | {1e3 * median:.1f} | {median / base:.3f} |")


if __name__ == "__main__":
    main()
