"""Pipeline parallelism on 8 simulated CPU devices: throughput, memory, bubble.

1. Training: the same GPT-NeoX (tiny preset, 8 layers) and global batch with
   pp=1 (sdp=8), pp=2 (sdp=4) and pp=4 (sdp=2) for every executable schedule;
   tokens/s of the fastest step after warm-up (the least disturbed by other
   processes on the shared cores) and per-device peak memory from the compiled
   step's memory_analysis (arguments + outputs + temporaries - aliased).
2. Bubble: the pipelined stack's forward+backward (runner over ``pp`` with p
   devices) against the same per-stage work without the pipeline (each stage
   runs its m*v microbatch-chunks back to back, no bubble, no transfers). The
   measured idle fraction is ``1 - t_useful / t_pipelined``; the formula is
   ``(p-1) / (m*v + p-1)``. Stages run in lock-step (SPMD), so it is one number
   for every stage. Measured for the autodiff runners (simple, virtual); 1F1B has
   the same formula and its table's idle ticks are checked by the simulator. "Idle
   without transfers" times the pipelined program with every ``ppermute`` the
   identity: the same compute and loop, no transfers (wrong values), so the gap
   between the two idle columns is what the transfers cost. The pipelined program's
   temporaries come from its memory_analysis (m=6 on p=4 is
   the virtual runner with stage 0's ring: p does not divide m).

3. Balance: GPT-NeoX with a realistic vocabulary (8 layers, d 512, vocab 50,304) at
   pp=4, 1F1B, ``pipeline_partition="equal"`` vs ``"auto"``. Measured on one device:
   a layer's forward, a layer's recompute+backward (1F1B's backward op) and the head
   with the loss, forward+backward (run inside the last stage's forward op); the
   lock-step simulator (:func:`jaxsmp.pipeline.simulator.lockstep_time`) turns them
   into each split's step time, per-stage busy time and idle fraction. The real steps
   are timed too, alternately (medians).

Simulated devices share the host's cores, so tokens/s does not show the speed-up
of real pipeline stages running concurrently (a CPU step costs the work of all stages
together, which a split does not change); the memory, bubble and simulated balance
columns do.

4. Tensor parallelism: 1F1B (fused lock-step ticks) against GPipe on pp=2, sdp=2,
   tp=2 (``bench/pipeline_tp.py``).

    python bench/pipeline.py [--steps 5] [--microbatches 8] [--only balance|tp|...]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import PartitionSpec as P
from pipeline_balance import Head, balance_table
from pipeline_tp import tp_table

import jaxsmp
from jaxsmp.nn import rotary_tables
from jaxsmp.pipeline import StageRunner, partition
from jaxsmp.pipeline.partition import stack_layers

SEQ, BATCH = 128, 32


def _peak_bytes(memory) -> int:
    return (memory.argument_size_in_bytes + memory.output_size_in_bytes
            + memory.temp_size_in_bytes - memory.alias_size_in_bytes)


def train_row(config, pp: int, schedule: str, microbatches: int, steps: int) -> dict:
    mesh = jaxsmp.Mesh(pp=pp)
    state = jaxsmp.init(config.build, optax.adamw(1e-3), mesh)
    options = dict(microbatches=microbatches if pp > 1 else 1)
    if pp > 1:
        options.update(pipeline=schedule, virtual_chunks=2)
    train_step = jaxsmp.step(jaxsmp.losses.causal_lm_loss, **options)
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, (BATCH, SEQ), np.int32)
    batch = {"tokens": tokens}
    memory = train_step.lower(state, batch).compile().memory_analysis()
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        state, metrics = train_step(state, batch)
        jax.block_until_ready(metrics["loss"])
        times.append(time.perf_counter() - start)
    return dict(pp=pp, sdp=mesh.sdp, schedule=schedule if pp > 1 else "-",
                m=options["microbatches"], loss=float(metrics["loss"]),
                tokens_per_s=BATCH * SEQ / min(times[1:]),
                peak_mib=_peak_bytes(memory) / 2**20)


def _mlp_run(h, w, _args):
    def layer(x, wi):
        return x + jnp.tanh(x @ wi), None
    return jax.lax.scan(layer, h, w)[0]


def _timed(fns, *args, repeats: int) -> list[float]:
    """Best times of ``fns``, run in turn so that load from other processes on the
    shared cores hits them alike."""
    jax.block_until_ready([fn(*args) for fn in fns])
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def bubble_row(p: int, v: int, m: int, layers: int = 8, d: int = 512, rows: int = 256,
               repeats: int = 15) -> dict:
    """Measured idle fraction of the pipelined stack vs the same work without bubble,
    and of the same pipelined program with every ``ppermute`` the identity (the
    runner's compute and loop, no transfers; its values are wrong)."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:p]), ("pp",))
    pipeline = StageRunner(p, m, v)
    w = jax.random.normal(jax.random.key(0), (layers, d, d)) / np.sqrt(d)
    x = jax.random.normal(jax.random.key(1), (m * rows, d))

    def pipelined(w, x):
        return jnp.sum(pipeline(_mlp_run, x, w, ()) ** 2)

    def useful(w, x):  # each stage: its m*v chunk-microbatches back to back
        xs = jax.lax.pcast(x.reshape(m, rows, d), ("pp",), to="varying")
        n = w.shape[0] // v

        def item(total, k):
            chunk = jax.lax.dynamic_slice_in_dim(w, (k // m) * n, n, 0)
            return total + jnp.sum(_mlp_run(xs[k % m], chunk, ()) ** 2), None
        zero = jax.lax.pcast(jnp.zeros((), x.dtype), ("pp",), to="varying")
        total = jax.lax.scan(item, zero, jnp.arange(m * v))[0]
        return jax.lax.psum(total, "pp")

    def compiled_grad(f):
        return jax.jit(jax.shard_map(jax.grad(f, argnums=(0, 1)), mesh=mesh,
                                     in_specs=(P("pp"), P()), out_specs=(P("pp"), P()))
                       ).lower(w, x).compile()

    pipe = compiled_grad(pipelined)
    ppermute, jax.lax.ppermute = jax.lax.ppermute, lambda x, axis_name, perm: x
    try:
        local = compiled_grad(pipelined)
    finally:
        jax.lax.ppermute = ppermute
    t_pipe, t_useful, t_local = _timed([pipe, compiled_grad(useful), local], w, x,
                                       repeats=repeats)
    return dict(p=p, v=v, m=m, ticks=pipeline.ticks, t_pipe_ms=t_pipe * 1e3,
                t_useful_ms=t_useful * 1e3, measured=1 - t_useful / t_pipe,
                without_transfers=1 - t_useful / t_local,
                formula=(p - 1) / (m * v + p - 1),
                temp_mib=pipe.memory_analysis().temp_size_in_bytes / 2**20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--only", choices=("train", "bubble", "plan", "balance", "tp"),
                        default=None)
    args = parser.parse_args()
    config = jaxsmp.models.preset("gpt_neox", "tiny", num_hidden_layers=8,
                                  attention_impl="reference")
    if args.only in (None, "train"):
        train_table(config, args)
    if args.only in (None, "bubble"):
        bubble_table()
    if args.only in (None, "plan"):
        plan(config)
    if args.only in (None, "balance"):
        balance_table(args.steps)
    if args.only in (None, "tp"):
        tp_table(args.steps)


def plan(config) -> None:
    """The partitioner's split of the benchmarked GPT-NeoX over 4 stages."""
    model = config.build(nnx.Rngs(0))
    tokens = jnp.zeros((BATCH // 8, SEQ), jnp.int32)  # one microbatch
    positions = jnp.broadcast_to(jnp.arange(SEQ), tokens.shape)
    cos, sin = rotary_tables(positions, config.rotary_dim, config.rotary_emb_base)
    print("\nPartitioner on the benchmarked model (4 stages, one microbatch):\n")
    for optimize in ("speed", "memory"):
        partition(stack_layers(model.layers), tokens, 4, embed=model.embed_in,
                  head=Head(model), layer_args=(cos, sin), optimize=optimize)


def train_table(config, args) -> None:
    runs = [(1, "simple")] + [(p, s) for p in (2, 4)
                              for s in ("simple", "interleaved", "virtual")]
    print(f"GPT-NeoX tiny, 8 layers, global batch {BATCH}x{SEQ} tokens, "
          f"{jax.device_count()} simulated devices\n")
    print("| pp | sdp | schedule | microbatches | tokens/s | peak MiB/device | loss |")
    print("|---|---|---|---|---|---|---|")
    for pp, schedule in runs:
        r = train_row(config, pp, schedule, args.microbatches, args.steps)
        print(f"| {r['pp']} | {r['sdp']} | {r['schedule']} | {r['m']} | "
              f"{r['tokens_per_s']:.0f} | {r['peak_mib']:.1f} | {r['loss']:.4f} |", flush=True)


def bubble_table() -> None:
    print("\nBubble: pipelined stack fwd+bwd vs the same work without bubble "
          "(8 MLP layers, d=512, 256 rows per microbatch, best of 15, alternating)\n")
    print("| p | v | m | ticks | pipelined ms | no-bubble ms | measured idle | "
          "idle without transfers | formula (p-1)/(mv+p-1) | pipelined temp MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for p, v, m in [(2, 1, 4), (2, 1, 8), (4, 1, 4), (4, 1, 8), (2, 2, 4), (4, 2, 4),
                    (4, 2, 8), (4, 2, 6)]:
        r = bubble_row(p, v, m)
        print(f"| {p} | {v} | {m} | {r['ticks']} | {r['t_pipe_ms']:.1f} | "
              f"{r['t_useful_ms']:.1f} | {r['measured']:.3f} | "
              f"{r['without_transfers']:.3f} | {r['formula']:.3f} | "
              f"{r['temp_mib']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
