"""Language-modelling losses.

The cross-entropy keeps the logits in the dtype they come in (the head's bf16 under
mixed precision) and computes in float32 inside its fusions: its backward keeps the
logits and one float32 log-normalizer per token, and returns the gradient in the logits'
dtype, so no float32 copy of the ``[tokens, vocab]`` logits is ever stored.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


@jax.custom_vjp
def token_nll(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Float32 negative log-likelihood of ``targets`` under ``logits`` (``[..., vocab]``),
    per position; computed in float32 whatever the logits' dtype."""
    return _nll_and_lse(logits, targets)[0]


def _nll_and_lse(logits: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array]:
    lse = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return lse - picked.astype(jnp.float32), lse


def _nll_forward(logits, targets):
    nll, lse = _nll_and_lse(logits, targets)
    return nll, (logits, targets, lse)


def _nll_backward(saved, g):
    logits, targets, lse = saved
    probs = jnp.exp(logits.astype(jnp.float32) - lse[..., None])
    picked = targets[..., None] == jnp.arange(logits.shape[-1], dtype=targets.dtype)
    grad = (probs - picked.astype(jnp.float32)) * g[..., None]
    return grad.astype(logits.dtype), None


token_nll.defvjp(_nll_forward, _nll_backward)


def cross_entropy(logits: jax.Array, targets: jax.Array,
                  mask: jax.Array | None = None) -> jax.Array:
    """Mean token cross-entropy in float32; ``mask`` (0/1) drops positions."""
    return _mean(token_nll(logits, targets), mask)


def _mean(nll: jax.Array, mask: jax.Array | None) -> jax.Array:
    if mask is None:
        return nll.mean()
    mask = mask.astype(jnp.float32)
    return (nll * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def next_token_loss(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """Cross-entropy of predicting ``tokens[:, 1:]`` from ``logits[:, :-1]``. The last
    position is masked rather than sliced off, so the logits are not copied."""
    if tokens.shape[1] < 2:
        raise ValueError(f"next-token loss needs sequences of at least 2 tokens, got "
                         f"tokens of shape {tuple(tokens.shape)}")
    targets = jnp.roll(tokens, -1, axis=1)
    keep = jnp.arange(tokens.shape[1]) < tokens.shape[1] - 1
    return cross_entropy(logits, targets, jnp.broadcast_to(keep, tokens.shape))


def cross_entropy_reference(logits: jax.Array, targets: jax.Array,
                            mask: jax.Array | None = None) -> jax.Array:
    """:func:`cross_entropy` as autodiff of the plain float32 computation (which keeps a
    float32 copy of the logits for the backward pass): the reference the tests compare."""
    logits = logits.astype(jnp.float32)
    nll = (jax.nn.logsumexp(logits, axis=-1)
           - jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0])
    return _mean(nll, mask)


def next_token_loss_reference(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """:func:`next_token_loss` as :func:`cross_entropy_reference` of the sliced logits."""
    return cross_entropy_reference(logits[:, :-1], tokens[:, 1:])


def causal_lm_loss(model, batch: dict) -> jax.Array | tuple[jax.Array, dict]:
    """The trainer's loss: :func:`next_token_loss` of the model's logits for
    ``batch["tokens"]``, in the compute dtype (``model.logits``, where the model has it,
    as jaxsmp's families do; else ``model(tokens)``). A mixture-of-experts model (one
    with ``with_router_losses``, Mixtral) adds its load-balancing and z losses times their
    config coefficients and returns ``(loss, metrics)``: ``lm_loss``, ``aux_loss``,
    ``z_loss``, ``dropped_tokens`` and ``expert_load`` (``[layers, experts]``, each
    layer's share of assignments per expert)."""
    tokens = batch["tokens"]
    if not hasattr(model, "with_router_losses"):
        logits = model.logits(tokens) if hasattr(model, "logits") else model(tokens)
        return next_token_loss(logits, tokens)
    logits, router = model.with_router_losses(tokens)
    lm = next_token_loss(logits, tokens)
    cfg = model.cfg
    loss = (lm + cfg.router_aux_loss_coef * router["aux_loss"]
            + cfg.router_z_loss_coef * router["z_loss"])
    return loss, {"lm_loss": lm, **router}
