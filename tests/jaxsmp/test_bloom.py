"""Bloom: published parameter counts, tied head, ALiBi positions, sharded training."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
from flax import nnx

import jaxsmp
from conftest import assert_causal, train
from jaxsmp.metrics import train_flops_per_token
from jaxsmp.models import bloom, count_params, preset

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(bloom.PUBLISHED_PARAMS))
def test_preset_parameter_counts_match_published(name):
    assert count_params(preset("bloom", name)) == bloom.PUBLISHED_PARAMS[name]


def test_50b_preset_is_about_50b():
    assert 49.5e9 < count_params(preset("bloom", "50b")) < 51e9


def test_head_is_tied_and_counted_as_a_matmul():
    cfg = preset("bloom", "560m")
    assert cfg.tie_word_embeddings
    abstract = nnx.eval_shape(lambda: cfg.build(nnx.Rngs(0)))
    vocab_shaped = [x.shape for x in jax.tree.leaves(nnx.state(abstract, nnx.Param))
                    if cfg.vocab_size in x.shape]
    assert vocab_shaped == [(cfg.vocab_size, cfg.hidden_size)]  # one table, no head
    attention = 12 * cfg.n_layer * cfg.hidden_size * 2048
    assert train_flops_per_token(cfg, 2048) == 6.0 * count_params(cfg) + attention


def _tiny():
    return preset("bloom", "tiny", n_layer=2, attention_impl="reference")


def test_forward_is_causal():
    assert_causal(jax.jit(_tiny().build(nnx.Rngs(0)).__call__))


def test_alibi_gives_the_model_word_order():
    """Bloom has no position embedding: without ALiBi the last position's output would
    not change when the earlier tokens are permuted."""
    model = jax.jit(_tiny().build(nnx.Rngs(0)).__call__)
    tokens = np.random.default_rng(1).integers(0, 256, (1, 16)).astype(np.int32)
    permuted = tokens.copy()
    permuted[0, :-1] = tokens[0, :-1][::-1]
    last = lambda t: np.asarray(model(t))[0, -1]
    assert np.abs(last(tokens) - last(permuted)).max() > 1e-3


def test_trains_on_sharded_mesh():
    tokens = np.random.default_rng(2).integers(0, 256, (8, 32)).astype(np.int32)
    _, losses = train(_tiny(), jaxsmp.Mesh(sdp=4, tp=2), tokens, steps=5,
                      tx=lambda: optax.adamw(3e-3))
    assert losses[-1] < losses[0] - 0.1, losses


def test_example_trains_bloom():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train_bloom.py"), "--steps", "3",
         "--batch-size", "8", "--seq-len", "32", "--eval-every", "0", "--no-progress",
         "--tp", "2", "--attention", "reference"],
        capture_output=True, text=True, timeout=300,
        env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "bloom tiny" in out.stdout + out.stderr
    assert "loss: first" in out.stdout
