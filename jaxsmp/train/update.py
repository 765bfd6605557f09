"""The optimizer update from the step's gradients: clipping, overflow skipping, metrics."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxsmp.train.fp8_state import has_fp8, roll_histories, trainable
from jaxsmp.train.options import StepOptions
from jaxsmp.train.precision import precision_policy
from jaxsmp.train.state import TrainState


def learning_rate(opt_state: Any) -> jax.Array | None:
    """The learning rate of an ``optax.inject_hyperparams`` optimizer (possibly chained)."""
    hyperparams = getattr(opt_state, "hyperparams", None)
    if isinstance(hyperparams, dict) and "learning_rate" in hyperparams:
        return hyperparams["learning_rate"]
    if isinstance(opt_state, tuple):
        for inner in opt_state:
            lr = learning_rate(inner)
            if lr is not None:
                return lr
    return None


def apply_gradients(state: TrainState, grads: nnx.State, options: StepOptions):
    """(new state, metrics) from unscaled gradients: clipped, and with float16 loss
    scaling an overflowing step leaves parameters and optimizer state untouched. fp8
    amax histories are rolled by their observations in ``grads``, not optimized."""
    dynamic = precision_policy(options.precision).loss_scaling
    fp8 = has_fp8(state.params)
    grads, observed = trainable(grads), grads
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(grad_norm)
    if options.clip_norm is not None:
        factor = jnp.minimum(1.0, options.clip_norm / (grad_norm + 1e-6))
        grads = jax.tree.map(lambda g: g * factor, grads)
    updates, opt_state = state.tx.update(grads, state.opt_state, trainable(state.params))
    params = optax.apply_updates(trainable(state.params), updates)
    if fp8:
        params = roll_histories(nnx.merge_state(state.params, params), observed)
    loss_scale = state.loss_scale
    if dynamic:
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
        params, opt_state = keep(params, state.params), keep(opt_state, state.opt_state)
        loss_scale = loss_scale.update(finite)
    new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                              loss_scale=loss_scale)
    metrics = {"grad_norm": grad_norm, "skipped": (~finite).astype(jnp.int32)}
    if dynamic:
        metrics["loss_scale"] = loss_scale.scale
    lr = learning_rate(opt_state)
    if lr is not None:
        metrics["learning_rate"] = jnp.asarray(lr, jnp.float32)
    return new_state, metrics
