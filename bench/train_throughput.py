"""jaxsmp's training step vs a hand-written plain JAX + Flax + optax FSDP baseline.

Both train the same GPT-NeoX module on the same batches on 8 simulated CPU
devices; steps of the two alternate in one run and the medians after warm-up
are compared. The baseline is the textbook jit-FSDP: every parameter and its
optimizer state sharded over one mesh axis on its first divisible dimension,
GSPMD inserting the gathers, value_and_grad + optax in one jit.

    python bench/train_throughput.py [--presets tiny 125m] [--steps 6]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

# bench/ holds collectives.py: put the repository first so `collectives` is the package
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

import jaxsmp  # noqa: E402
from jaxsmp.metrics import peak_flops_per_device, train_flops_per_token  # noqa: E402


def _fsdp_spec(x, n: int, stacked: bool) -> P:
    dims = [None] * x.ndim
    for i in range(1 if stacked else 0, x.ndim):
        if x.shape[i] % n == 0:
            dims[i] = "fsdp"
            break
    return P(*dims)


def baseline(config, tx):
    """Plain jit FSDP: returns (state, step) with state = (params, opt_state)."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("fsdp",))
    n = mesh.shape["fsdp"]
    abstract = nnx.eval_shape(lambda: config.build(nnx.Rngs(0)))
    graphdef, abs_params = nnx.split(abstract, nnx.Param)
    specs = jax.tree_util.tree_map_with_path(
        lambda path, x: NamedSharding(mesh, _fsdp_spec(x, n, "layers" in str(path))), abs_params)

    def create():
        params = nnx.state(config.build(nnx.Rngs(0)), nnx.Param)
        return params, tx.init(params)
    opt_specs = optax.tree_map_params(  # moments sharded like their parameters
        tx, lambda _, spec: spec, jax.eval_shape(tx.init, abs_params), specs,
        transform_non_params=lambda _: NamedSharding(mesh, P()))
    params, opt_state = jax.jit(create, out_shardings=(specs, opt_specs))()
    batch_sharding = NamedSharding(mesh, P("fsdp"))

    @jax.jit
    def step(params, opt_state, batch):
        def f(p):
            return jaxsmp.losses.causal_lm_loss(nnx.merge(graphdef, p), batch)
        loss, grads = jax.value_and_grad(f)(params)
        grads = optax.clip_by_global_norm(1.0).update(grads, None)[0]
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def run(state, batch):
        params, opt_state = state
        batch = {"tokens": jax.device_put(batch["tokens"], batch_sharding)}
        params, opt_state, loss = step(params, opt_state, batch)
        return (params, opt_state), loss
    return (params, opt_state), run


def ours(config, tx, **options):
    state = jaxsmp.init(config.build, tx, jaxsmp.Mesh(sdp=8, collectives="xla"))
    train_step = jaxsmp.step(jaxsmp.losses.causal_lm_loss, **options)

    def run(state, batch):
        state, metrics = train_step(state, batch)
        return state, metrics["loss"]
    return state, run


def timed(run, state, batch):
    start = time.perf_counter()
    state, loss = run(state, batch)
    loss = float(loss)
    return state, time.perf_counter() - start, loss


def measure(preset: str, steps: int, warmup: int, batch: int, seq: int, peak: float) -> list:
    config = jaxsmp.models.preset("gpt_neox", preset, attention_impl="blockwise")
    tx = optax.adamw(1e-4)
    contenders = {"plain jit FSDP": baseline(config, tx),
                  "jaxsmp sdp=8, bucketed gathers": ours(config, tx),
                  "jaxsmp sdp=8, per-parameter gathers": ours(config, tx, bucket=False)}
    states = {k: v[0] for k, v in contenders.items()}
    times = {k: [] for k in contenders}
    rng = np.random.default_rng(0)
    for i in range(warmup + steps):
        data = {"tokens": rng.integers(0, 256, (batch, seq)).astype(np.int32)}
        for name, (_, run) in contenders.items():
            states[name], seconds, _ = timed(run, states[name], data)
            if i >= warmup:
                times[name].append(seconds)
    flops = train_flops_per_token(config, seq) * batch * seq
    rows = []
    for name, ts in times.items():
        t = statistics.median(ts)
        tflops = flops / t / len(jax.devices()) / 1e12
        rows.append((preset, name, batch * seq / t, t, tflops, 100 * tflops * 1e12 / peak))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--presets", nargs="+", default=["tiny", "125m"])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()
    peak, source = peak_flops_per_device()
    print(f"peak {peak / 1e12:.3g} TFLOP/s per device ({source}); "
          f"medians of {args.steps} steps after {args.warmup} warm-up, alternating\n")
    print("| preset | implementation | tokens/s | step time (s) | TFLOP/s/device | MFU | ratio |")
    print("|---|---|---|---|---|---|---|")
    for preset in args.presets:
        rows = measure(preset, args.steps, args.warmup, args.batch, args.seq, peak)
        base = rows[0][2]
        for p, name, tps, t, tf, mfu in rows:
            print(f"| {p} | {name} | {tps:,.0f} | {t:.3f} | {tf:.4f} | {mfu:.1f}% | {tps / base:.2f} |")


if __name__ == "__main__":
    main()
