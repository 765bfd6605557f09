"""Language-modelling losses."""
from __future__ import annotations

import jax
import jax.numpy as jnp


def cross_entropy(logits: jax.Array, targets: jax.Array,
                  mask: jax.Array | None = None) -> jax.Array:
    """Mean token cross-entropy in float32; ``mask`` (0/1) drops positions."""
    logits = logits.astype(jnp.float32)
    logz = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    nll = logz - picked
    if mask is None:
        return nll.mean()
    mask = mask.astype(jnp.float32)
    return (nll * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def next_token_loss(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """Cross-entropy of predicting ``tokens[:, 1:]`` from ``logits[:, :-1]``."""
    if tokens.shape[1] < 2:
        raise ValueError(f"next-token loss needs sequences of at least 2 tokens, got "
                         f"tokens of shape {tuple(tokens.shape)}")
    return cross_entropy(logits[:, :-1], tokens[:, 1:])


def causal_lm_loss(model, batch: dict) -> jax.Array | tuple[jax.Array, dict]:
    """The trainer's loss: :func:`next_token_loss` of ``model(batch["tokens"])``. A
    mixture-of-experts model (one with ``with_router_losses``, Mixtral) adds its
    load-balancing and z losses times their config coefficients and returns
    ``(loss, metrics)``: ``lm_loss``, ``aux_loss``, ``z_loss``, ``dropped_tokens`` and
    ``expert_load`` (``[layers, experts]``, each layer's share of assignments per expert)."""
    tokens = batch["tokens"]
    if not hasattr(model, "with_router_losses"):
        return next_token_loss(model(tokens), tokens)
    logits, router = model.with_router_losses(tokens)
    lm = next_token_loss(logits, tokens)
    cfg = model.cfg
    loss = (lm + cfg.router_aux_loss_coef * router["aux_loss"]
            + cfg.router_z_loss_coef * router["z_loss"])
    return loss, {"lm_loss": lm, **router}
