"""Pipeline balance: 1F1B at pp=4, ``pipeline_partition="equal"`` with the head on the
last stage vs ``"auto"`` (the split and ``pipeline_head`` chosen on compiled costs).

Run through ``python bench/pipeline.py --only balance`` (its docstring says what is
measured and simulated).
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import jaxsmp
from jaxsmp.losses import next_token_loss
from jaxsmp.nn import rotary_tables
from jaxsmp.pipeline import make_schedule
from jaxsmp.pipeline.partition import stack_layers
from jaxsmp.pipeline.simulator import async_time, lockstep_time
from jaxsmp.pipeline.timing import one_f_one_b_seconds

PP, SDP, MICRO, BATCH, SEQ = 4, 2, 4, 32, 128  # 4 rows per microbatch and device
WIDTH = dict(num_hidden_layers=8, hidden_size=512, num_attention_heads=8,
             intermediate_size=2048, attention_impl="reference")


class Head(nnx.Module):
    """A GPT-NeoX's final norm and vocabulary projection."""

    def __init__(self, model):
        self.norm, self.out = model.final_layer_norm, model.embed_out

    def __call__(self, x):
        return self.out(self.norm(x))


def _medians(fns: list, args: list, repeats: int) -> list[float]:
    """Median seconds of each ``fns[i](*args[i])``, run alternately."""
    jax.block_until_ready([f(*a) for f, a in zip(fns, args)])
    times = [[] for _ in fns]
    for _ in range(repeats):
        for i, (f, a) in enumerate(zip(fns, args)):
            start = time.perf_counter()
            jax.block_until_ready(f(*a))
            times[i].append(time.perf_counter() - start)
    return [float(np.median(t)) for t in times]


def piece_times(config, repeats: int = 7) -> tuple[float, float, float]:
    """Measured (layer forward, layer recompute + backward, head + loss forward +
    backward) seconds on one microbatch of one device's rows."""
    rows = BATCH // SDP // MICRO
    model = config.build(nnx.Rngs(0))
    graphdef, w = nnx.split(stack_layers(model.layers)[0])
    head_def, head = nnx.split(Head(model))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, config.vocab_size, (rows, SEQ)),
                         jnp.int32)
    h = jax.random.normal(jax.random.key(0), (rows, SEQ, config.hidden_size))
    positions = jnp.broadcast_to(jnp.arange(SEQ), (rows, SEQ))
    cos, sin = rotary_tables(positions, config.rotary_dim, config.rotary_emb_base)

    def layer(w, h):
        return nnx.merge(graphdef, w)(h, cos, sin)

    def layer_back(w, h, g):
        return jax.vjp(layer, w, h)[1](g)

    def head_loss(p, y):
        return next_token_loss(nnx.merge(head_def, p)(y), tokens)
    fns = [jax.jit(layer), jax.jit(layer_back), jax.jit(jax.grad(head_loss, argnums=(0, 1)))]
    return tuple(_medians(fns, [(w, h), (w, h, h), (head, h)], repeats))


def simulated(counts, pieces, run=None, spread: bool = False):
    """(step, busy per stage, idle fraction per stage) of 1F1B in lock-step (jaxsmp's
    SPMD runner), or as ``run`` (e.g. :func:`async_time`) runs it. ``spread``: the
    head runs on every stage, ``1/PP`` each, after each of the last stage's forwards
    (lock-step only: it synchronises the stages)."""
    t_f, t_fb, t_head = pieces
    if spread:
        step = one_f_one_b_seconds(counts, MICRO, t_f, t_fb, t_head, spread_head=True)
        busy = [MICRO * (n * (t_f + t_fb) + t_head / PP) for n in counts]
        return step, busy, [1 - b / step for b in busy]

    def duration(stage, op):
        n = counts[stage]
        if op.kind == "B":
            return n * t_fb
        return n * t_f + (t_head if stage == PP - 1 else 0.0)
    timing = (run or lockstep_time)(make_schedule("interleaved", PP, MICRO), duration)
    return timing.step, timing.busy, timing.idle_fraction


def measured_steps(config, steps: int) -> tuple[dict, list[float]]:
    """({option: (split, head)} each runs, median CPU step seconds), steps alternating."""
    mesh = jaxsmp.Mesh(pp=PP, sdp=SDP)
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, (BATCH, SEQ), np.int32)
    batch = {"tokens": tokens}
    runs, splits = [], {}
    for option, head in (("equal", "last"), ("auto", "auto")):
        step = jaxsmp.step(jaxsmp.losses.causal_lm_loss, microbatches=MICRO,
                           pipeline="interleaved", pipeline_partition=option,
                           pipeline_head=head)
        state = jaxsmp.init(config.build, optax.sgd(1e-3), mesh)
        splits[option] = (step.pipeline_partition(state, batch),
                          step.pipeline_head(state, batch))
        runs.append((step, [state]))

    def one(step, holder):
        holder[0], metrics = step(holder[0], batch)
        return metrics["loss"]
    times = _medians([one] * 2, [r for r in runs], steps)
    return splits, times


def _counts(split) -> tuple[int, ...]:
    return (WIDTH["num_hidden_layers"] // PP,) * PP if split == "equal" else tuple(split)


def balance_table(steps: int) -> None:
    print(f"\nBalance: GPT-NeoX 8 layers d=512, 1F1B, pp={PP} sdp={SDP}, {MICRO} microbatches "
          f"of {BATCH // SDP // MICRO}x{SEQ} tokens per device\n")
    print("| vocab | option | layers per stage | head | CPU step s (median) | lock-step ms | "
          "busy ms per stage | idle fraction per stage | lock-step speed-up | "
          "asynchronous ms (speed-up) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for vocab in (50304, 8192, 512):
        config = jaxsmp.models.preset("gpt_neox", "tiny", vocab_size=vocab, **WIDTH)
        pieces = piece_times(config)
        splits, cpu = measured_steps(config, steps)
        base = simulated(_counts(splits["equal"][0]), pieces)[0]
        base_async = simulated(_counts(splits["equal"][0]), pieces, async_time)[0]
        for (option, (split, head)), t in zip(splits.items(), cpu):
            spread = head == "spread"
            step, busy, idle = simulated(_counts(split), pieces, spread=spread)
            free = ("-" if spread else
                    f"{(a := simulated(_counts(split), pieces, async_time)[0]) * 1e3:.1f} "
                    f"({base_async / a:.2f}x)")
            print(f"| {vocab} | {option} | {_counts(split)} | {head} | {t:.2f} | "
                  f"{step * 1e3:.1f} | {', '.join(f'{b * 1e3:.1f}' for b in busy)} | "
                  f"{', '.join(f'{i:.2f}' for i in idle)} | {base / step:.2f}x | {free} |",
                  flush=True)
        print(f"|  | pieces ms: layer F {pieces[0] * 1e3:.1f}, layer B {pieces[1] * 1e3:.1f}, "
              f"head+loss F+B {pieces[2] * 1e3:.1f} | | | | | | | | |", flush=True)
