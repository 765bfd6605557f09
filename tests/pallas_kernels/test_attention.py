"""The attention entry point: dispatch, agreement between impls, and input validation."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attention_cases import Case, make_inputs
from pallas_kernels import attention
from pallas_kernels.attention import resolve_impl


def _qkv(seq=64, heads=4, kv_heads=2, head_dim=16, dtype=jnp.float32, seed=0):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    return (jax.random.normal(kq, (1, seq, heads, head_dim), dtype),
            jax.random.normal(kk, (1, seq, kv_heads, head_dim), dtype),
            jax.random.normal(kv, (1, seq, kv_heads, head_dim), dtype))


def test_auto_is_blockwise_off_gpu() -> None:
    assert jax.default_backend() == "cpu"
    assert resolve_impl("auto") == "blockwise"


def test_impls_agree_through_entry_point() -> None:
    case = Case(64, 4, 2, 32, causal=True, alibi=True, segments=True, seed=30)
    inputs = make_inputs(case)
    kwargs = dict(causal=True, alibi_slopes=inputs["alibi_slopes"],
                  segment_ids=inputs["segment_ids"], softmax_scale=0.3)

    def grads(impl, **extra):
        def loss(q, k, v):
            out = attention(q, k, v, impl=impl, **kwargs, **extra)
            return jnp.sum(out * inputs["cotangent"])
        return jax.value_and_grad(loss, argnums=(0, 1, 2))(inputs["q"], inputs["k"],
                                                           inputs["v"])

    want = grads("reference")
    for impl, extra in (("auto", {}), ("blockwise", dict(block_q=16, block_k=32)),
                        ("pallas", dict(block_q=32, block_k=16, interpret=True))):
        got = grads(impl, **extra)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-4,
                                       err_msg=impl)


def test_default_call_works_under_jit() -> None:
    q, k, v = _qkv(seq=1024)
    out = jax.jit(lambda q, k, v: attention(q, k, v, causal=True))(q, k, v)
    ref = attention(q, k, v, causal=True, impl="reference")
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-4, atol=1e-5)


def test_default_blocks_are_capped_at_seq_len() -> None:
    q, k, v = _qkv(seq=100)  # below the blockwise default of 512: one block of 100
    out = attention(q, k, v, causal=False, impl="blockwise")
    ref = attention(q, k, v, causal=False, impl="reference")
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kwargs, inputs, match", [
    (dict(impl="flash"), {}, r"unknown attention impl 'flash'.*'auto'"),
    ({}, dict(kv_heads=3), r"kv heads 3 must divide query heads 4"),
    (dict(impl="pallas"), dict(head_dim=48), r"head_dim in \(16, 32, 64, 128, 256\), got 48"),
    (dict(impl="pallas", block_q=24), {}, r"block_q=24 must be positive and divide"),
    (dict(impl="pallas", block_k=8), {}, r"power of two >= 16, got 8"),
    (dict(impl="blockwise", block_k=48), {}, r"block_k=48 must be positive and divide seq"),
    (dict(impl="pallas"), dict(seq=100), r"block_q=64 must be positive and divide seq len 100"),
    (dict(impl="reference", block_q=16), {}, r"reference' is unblocked"),
    (dict(impl="blockwise"), dict(dtype=jnp.int32), r"one dtype among float32"),
    (dict(alibi_slopes=jnp.ones(3)), {}, r"alibi_slopes must have shape \(4,\)"),
    (dict(segment_ids=jnp.zeros((1, 64), jnp.float32)), {}, r"segment_ids must be integer"),
])
def test_unsupported_inputs_raise(kwargs, inputs, match) -> None:
    inputs = dict(inputs)
    dtype = inputs.pop("dtype", jnp.float32)
    q, k, v = (x.astype(dtype) for x in _qkv(**inputs))
    with pytest.raises(ValueError, match=match):
        attention(q, k, v, causal=True, **kwargs)
