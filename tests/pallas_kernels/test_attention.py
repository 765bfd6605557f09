"""The attention entry point: dispatch, agreement between impls, and input validation."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_cases import Case, assert_matches_reference, make_inputs

from pallas_kernels import attention
from pallas_kernels.attention import REFERENCE_SCORE_BYTES, choose_impl


def _qkv(seq=64, heads=4, kv_heads=2, head_dim=16, dtype=jnp.float32, seed=0):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    return (jax.random.normal(kq, (1, seq, heads, head_dim), dtype),
            jax.random.normal(kk, (1, seq, kv_heads, head_dim), dtype),
            jax.random.normal(kv, (1, seq, kv_heads, head_dim), dtype))


def test_auto_off_gpu_materialises_scores_up_to_the_budget_then_goes_blockwise() -> None:
    assert jax.default_backend() == "cpu"
    budget = REFERENCE_SCORE_BYTES
    pick = lambda score_bytes: choose_impl(jnp.bfloat16, 64, alibi=True, segments=True,
                                           score_bytes=score_bytes)
    assert pick(budget) == "reference" and pick(budget + 1) == "blockwise"
    assert pick(None) == "blockwise"


def test_auto_picks_by_the_local_score_matrix_size() -> None:
    small = _qkv(128, 4, 4, 32)       # 1 x 4 x 128^2 x 4 bytes of scores: reference
    long = _qkv(2048, 4, 4, 32)       # 64 MiB: blockwise
    jaxpr = lambda qkv: str(jax.make_jaxpr(lambda *a: attention(*a, causal=True))(*qkv))
    assert "while" not in jaxpr(small) and "while" in jaxpr(long)


@pytest.mark.parametrize("dtype, head_dim, alibi, segments, want", [
    (jnp.bfloat16, 64, False, False, "cudnn"),     # GPT-NeoX, Llama in bf16
    (jnp.float16, 80, False, False, "cudnn"),      # GPT-NeoX 2.7b
    (jnp.bfloat16, 128, False, False, "cudnn"),
    (jnp.bfloat16, 64, True, False, "pallas"),     # Bloom: ALiBi
    (jnp.bfloat16, 64, False, True, "pallas"),     # packed sequences
    (jnp.float32, 64, False, False, "pallas"),     # cuDNN has no float32 attention
    (jnp.bfloat16, 256, False, False, "pallas"),   # above cuDNN's head dim limit
    (jnp.bfloat16, 36, False, False, "pallas"),    # not a multiple of 8
])
def test_auto_on_gpu_picks_cudnn_where_it_applies(dtype, head_dim, alibi, segments, want):
    assert choose_impl(dtype, head_dim, alibi=alibi, segments=segments, platform="cuda") == want


PADDED = [  # head dims and lengths off the Pallas tile sizes (zero-padded inside)
    Case(100, 4, 2, 48, causal=True, alibi=True, segments=False, seed=11, batch=1),
    Case(70, 2, 2, 80, causal=False, alibi=False, segments=False, seed=12, batch=1),
    Case(50, 4, 4, 96, causal=False, alibi=True, segments=True, seed=13, batch=1),
    Case(20, 2, 1, 24, causal=True, alibi=False, segments=True, seed=14, batch=1),
]


@pytest.mark.parametrize("case", PADDED, ids=str)
def test_pallas_pads_any_head_dim_and_length(case) -> None:
    # max |err| / max |ref| of out, dq, dk, dv against float64, as for the unpadded kernel
    def build(inputs):
        def fn(q, k, v):
            return attention(q, k, v, causal=case.causal, alibi_slopes=inputs["alibi_slopes"],
                             segment_ids=inputs["segment_ids"], impl="pallas", block_q=16,
                             block_k=32)
        return fn
    assert_matches_reference(build, case, {"float32": 5e-6})


def test_pallas_works_under_x64() -> None:
    q, k, v = _qkv(seq=64)
    with jax.enable_x64(True):
        out = attention(q, k, v, causal=True, impl="pallas")
        grad = jax.grad(lambda q: attention(q, k, v, causal=True, impl="pallas").sum())(q)
    ref = attention(q, k, v, causal=True, impl="reference")
    ref_grad = jax.grad(lambda q: attention(q, k, v, causal=True, impl="reference").sum())(q)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(ref_grad), rtol=1e-4, atol=1e-5)


def test_cudnn_off_gpu_says_what_it_needs() -> None:
    q, k, v = (x.astype(jnp.bfloat16) for x in _qkv())
    with pytest.raises(RuntimeError, match=r"impl 'cudnn' needs an NVIDIA GPU with cuDNN"):
        attention(q, k, v, causal=True, impl="cudnn")


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
    (dict(impl="pallas"), dict(head_dim=512), r"head dims up to 256, got 512"),
    (dict(impl="pallas", block_q=24), {}, r"needs block_q a power of two >= 16, got 24"),
    (dict(impl="pallas", block_k=8), {}, r"power of two >= 16, got 8"),
    (dict(impl="blockwise", block_k=48), {}, r"block_k=48 must be positive and divide seq"),
    (dict(impl="reference", block_q=16), {}, r"impl 'reference' has no blocks"),
    (dict(impl="blockwise", interpret=True), {}, r"interpret applies to impl 'pallas' only"),
    (dict(impl="cudnn"), {}, r"impl 'cudnn' needs float16 or bfloat16 inputs"),
    (dict(impl="cudnn", alibi_slopes=jnp.ones(4)), {}, r"cudnn' takes neither ALiBi"),
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


def test_importing_needs_no_pallas_gpu_module() -> None:
    # A JAX without the Triton Pallas module still imports jaxsmp and runs blockwise
    # attention; only impl="pallas" needs it, and says so when called.
    import subprocess
    import sys
    code = """
import sys
sys.modules["jax.experimental.pallas.triton"] = None  # import of it fails
import jax.numpy as jnp
import jaxsmp, pallas_kernels
q = jnp.ones((1, 16, 2, 16))
pallas_kernels.attention(q, q, q, causal=True, impl="blockwise")
try:
    pallas_kernels.attention(q, q, q, causal=True, impl="pallas")
except ImportError as e:
    print("pallas needs:", e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pallas needs:" in out.stdout


def _score_sized_residuals(fn, q, k, v) -> int:
    """How many [b, h, s, s] arrays the backward pass of ``fn`` keeps."""
    _, pullback = jax.vjp(fn, q, k, v)
    b, s, h, _ = q.shape
    return sum(x.shape == (b, h, s, s) for x in jax.tree.leaves(pullback))


def test_the_reference_keeps_nothing_score_sized_for_the_backward_pass() -> None:
    q, k, v = _qkv()
    kept = _score_sized_residuals(
        lambda q, k, v: attention(q, k, v, causal=True, impl="reference"), q, k, v)
    assert kept == 0
    # plain autodiff of the same computation keeps probabilities, scores, exponentials
    # and masks
    from pallas_kernels.reference import attention_reference
    plain = _score_sized_residuals(
        lambda q, k, v: attention_reference(q, k, v, causal=True), q, k, v)
    assert plain > 1, plain
