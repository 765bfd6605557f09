"""The JAX contenders on one device: jaxsmp's step, and a hand-written ``jax.jit`` step
of the same Flax model and loss (bf16 compute, float32 master weights, AdamW, clipping)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

import jaxsmp
from bench.gpucheck.common import jax_peak_bytes, random_tokens, time_steps
from jaxsmp.losses import causal_lm_loss

LEARNING_RATE = 1e-4


def config_of(row: dict):
    return jaxsmp.models.preset(row["family"], row["preset"], **row["config"],
                                attention_impl=row["attention"])


def _tokens(row: dict):
    return jnp.asarray(random_tokens(row["batch"], row["seq"], row["config"]["vocab_size"]))


def _measured(timing: dict, loss) -> dict:
    peak = jax_peak_bytes()
    loss = float(loss)
    if not jnp.isfinite(loss):
        raise FloatingPointError(f"loss {loss} after the timed steps")
    return {**timing, "loss": loss, "peak_gib": None if peak is None else peak / 2**30}


def jaxsmp_step(row: dict, precision: str = "bf16", remat: str = "none"):
    """(state, step, batch) of jaxsmp on this process's first device."""
    mesh = jaxsmp.Mesh(devices=jax.devices()[:1])
    state = jaxsmp.init(config_of(row).build, optax.adamw(LEARNING_RATE), mesh)
    step = jaxsmp.step(causal_lm_loss, precision=precision, remat=remat)
    return state, step, {"tokens": _tokens(row)}


def measure_jaxsmp(row: dict, deadline: float, target_s: float, precision: str = "bf16",
                   remat: str = "none") -> tuple[dict, object, object, dict]:
    """(measurements, the state after them, the step, the batch)."""
    state, step, batch = jaxsmp_step(row, precision, remat)
    holder = {"state": state}

    def once():
        holder["state"], metrics = step(holder["state"], batch)
        return metrics["loss"]
    timing = time_steps(once, jax.block_until_ready, deadline=deadline, target_s=target_s)
    return _measured(timing, once()), holder["state"], step, batch


def run_jaxsmp(row: dict, deadline: float, target_s: float, precision: str = "bf16",
               remat: str = "none") -> dict:
    return measure_jaxsmp(row, deadline, target_s, precision, remat)[0]


def run_jit(row: dict, deadline: float, target_s: float) -> dict:
    config, tx = config_of(row), optax.adamw(LEARNING_RATE)
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: config.build(nnx.Rngs(0))), nnx.Param)

    @jax.jit
    def create():
        params = nnx.state(config.build(nnx.Rngs(0)), nnx.Param)
        return params, tx.init(params)

    def loss_fn(params, batch):
        low = jax.tree.map(lambda p: p.astype(jnp.bfloat16)
                           if jnp.issubdtype(p.dtype, jnp.floating) else p, params)
        return causal_lm_loss(nnx.merge(graphdef, low), batch)

    def step(state, batch):
        params, opt_state = state
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        grads = optax.clip_by_global_norm(1.0).update(grads, None)[0]
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    step = jax.jit(step, donate_argnums=0)
    holder, batch = {"state": create()}, {"tokens": _tokens(row)}

    def once():
        holder["state"], loss = step(holder["state"], batch)
        return loss
    return _measured(time_steps(once, jax.block_until_ready, deadline=deadline,
                                target_s=target_s), once())
