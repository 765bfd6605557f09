"""Tokens/s of the tiny Mixtral's training step on one CPU device, side by side with
(a) a dense Llama with the same active parameters (its MLP as wide as top_k experts),
(b) a hand-written JAX step of the same Mixtral (jit(value_and_grad) + optax, no
jaxsmp.step), and the MoE block alone, forward+backward: the dropless grouped GEMMs
(ragged_dot over the assignments sorted by expert) against every expert computed over
every token and masked (the dense GShard-style formulation), same routing. Prints a
markdown table of medians; the ratios are what to read (the host is shared).

    python bench/moe_cpu.py [--batch 8] [--seq 128] [--runs 5]
"""
from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_cpu_experimental_ynn_fusion_type=").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jaxsmp
from jaxsmp.models import count_params, preset
from jaxsmp.nn.moe import router_stats


def median_seconds(fn, runs: int) -> float:
    fn()  # compile and warm up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def jaxsmp_step(cfg, tokens):
    mesh = jaxsmp.Mesh(sdp=1, devices=jax.devices()[:1])
    state = [jaxsmp.init(cfg.build, optax.adamw(1e-3), mesh, seed=0)]
    step = jaxsmp.step(jaxsmp.losses.causal_lm_loss)

    def run():
        state[0], metrics = step(state[0], {"tokens": tokens})
        jax.block_until_ready(metrics["loss"])
    return run


def hand_written_step(cfg, tokens):
    model = cfg.build(nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)
    tx = optax.adamw(1e-3)
    carry = [params, tx.init(params)]

    @jax.jit
    def step(params, opt, tokens):
        def loss(p):
            logits, router = nnx.merge(graphdef, p).with_router_losses(tokens)
            lm = jaxsmp.losses.next_token_loss(logits, tokens)
            return lm + cfg.router_aux_loss_coef * router["aux_loss"]
        value, grads = jax.value_and_grad(loss)(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, value

    def run():
        carry[0], carry[1], value = step(carry[0], carry[1], tokens)
        jax.block_until_ready(value)
    return run


def moe_block(moe, x, dense: bool):
    """forward+backward of the MoE block; ``dense``: every expert on every token."""
    graphdef, params = nnx.split(moe)

    def grouped(p, x):
        return nnx.merge(graphdef, p)(x, router_stats(1, 4, x))[0]

    def masked(p, x):
        m = nnx.merge(graphdef, p)
        t = x.reshape(-1, x.shape[-1])
        logits, chosen, weights = m.route(t)
        gates = jnp.zeros_like(logits).at[jnp.arange(t.shape[0])[:, None], chosen].set(weights)
        h = jax.nn.silu(jnp.einsum("td,edf->etf", t, m.gate_proj[...])) * jnp.einsum(
            "td,edf->etf", t, m.up_proj[...])
        y = jnp.einsum("etf,efd->etd", h, m.down_proj[...])
        return jnp.einsum("etd,te->td", y, gates).reshape(x.shape)

    f = masked if dense else grouped
    grad = jax.jit(jax.value_and_grad(lambda p, x: jnp.sum(f(p, x) ** 2), argnums=(0, 1)))
    return lambda: jax.block_until_ready(grad(params, x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    moe = preset("mixtral", "tiny", attention_impl="reference")
    dense = preset("llama", "tiny", attention_impl="reference", num_hidden_layers=4,
                   intermediate_size=moe.num_experts_per_tok * moe.intermediate_size,
                   num_key_value_heads=moe.kv_heads, hidden_size=moe.hidden_size,
                   num_attention_heads=moe.num_attention_heads)
    active = count_params(moe) - moe.inactive_expert_params
    tokens = np.random.default_rng(0).integers(0, 256, (args.batch, args.seq)).astype(np.int32)
    n = args.batch * args.seq
    rows = [("mixtral tiny, jaxsmp.step", jaxsmp_step(moe, tokens)),
            ("dense llama, same active params, jaxsmp.step", jaxsmp_step(dense, tokens)),
            ("mixtral tiny, hand-written jit step", hand_written_step(moe, tokens))]
    print(f"one CPU device, batch {args.batch} x seq {args.seq}; mixtral active params "
          f"{active:,} (of {count_params(moe):,}), dense llama {count_params(dense):,}\n")
    print("| step | tokens/s | vs mixtral jaxsmp.step |\n| --- | ---: | ---: |")
    base = None
    for name, run in rows:
        rate = n / median_seconds(run, args.runs)
        base = base or rate
        print(f"| {name} | {rate:,.0f} | {rate / base:.2f} |")
    from jaxsmp.nn.moe import MoE
    block = MoE(moe.hidden_size, moe.intermediate_size, moe.num_local_experts,
                moe.num_experts_per_tok, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (args.batch, args.seq, moe.hidden_size))
    print("\n| MoE block fwd+bwd | seconds | vs grouped |\n| --- | ---: | ---: |")
    grouped = median_seconds(moe_block(block, x, dense=False), args.runs)
    masked = median_seconds(moe_block(block, x, dense=True), args.runs)
    print(f"| grouped GEMMs (ragged_dot) | {grouped:.4f} | 1.00 |")
    print(f"| every expert on every token, masked | {masked:.4f} | {masked / grouped:.2f} |")


if __name__ == "__main__":
    main()
