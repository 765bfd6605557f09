"""Pallas FlashAttention kernels (interpret mode on CPU) against a float64 reference."""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_cases import Case, assert_matches_reference, make_inputs

from pallas_kernels.flash_attention import flash_attention

# max |err| / max |ref| for the output and each gradient, ~10x above the worst observed
# (float32 6e-7, bfloat16 5e-3, float16 7e-4). Low-precision errors come from rounding p and
# ds to the input dtype before the matmuls and from rounding the outputs.
TOLERANCES = {"float32": 5e-6, "bfloat16": 3e-2, "float16": 5e-3}

CASES = [
    Case(64, 4, 4, 32, causal=True, alibi=False, segments=False, block_q=16, block_k=32,
         seed=1),
    Case(128, 6, 2, 16, causal=False, alibi=True, segments=True, block_q=32, block_k=16,
         seed=2),
    Case(64, 4, 1, 64, causal=True, alibi=True, segments=True, block_q=32, block_k=32,
         seed=3),
    Case(32, 2, 2, 16, causal=False, alibi=True, segments=False, seed=4),
    Case(64, 4, 2, 32, causal=True, alibi=False, segments=True, block_q=32, block_k=16,
         seed=5),
    Case(64, 4, 2, 32, causal=True, alibi=True, segments=True, dtype="bfloat16", seed=6),
    Case(128, 2, 1, 64, causal=False, alibi=False, segments=False, dtype="bfloat16",
         block_q=32, block_k=32, seed=7),
    Case(64, 4, 4, 16, causal=True, alibi=True, segments=False, dtype="float16", seed=8),
]


def _pallas(case: Case):
    def build(inputs):
        def fn(q, k, v):
            return flash_attention(q, k, v, inputs["alibi_slopes"], inputs["segment_ids"],
                                   case.head_dim ** -0.5, case.causal, case.block_q,
                                   case.block_k, True)
        return fn
    return build


@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_float64_reference(case: Case) -> None:
    assert_matches_reference(_pallas(case), case, TOLERANCES)


def test_causal_skips_fully_masked_key_blocks() -> None:
    """NaN values in keys after the first block must not reach the first query block.

    A masked-but-visited block would still multiply its zero probabilities by NaN values.
    """
    case = Case(64, 2, 1, 16, causal=True, alibi=False, segments=False, seed=9)
    inputs = make_inputs(case)
    v = inputs["v"].at[:, 16:].set(jnp.nan)
    out = flash_attention(inputs["q"], inputs["k"], v, None, None, 0.25, True, 16, 16, True)
    assert np.all(np.isfinite(np.asarray(out[:, :16])))
    assert np.all(np.isnan(np.asarray(out[:, 16:])))


def test_forward_and_backward_lower_to_triton_for_cuda(triton_target_gpu) -> None:
    """On this CPU machine, lower fwd+bwd for CUDA: three Triton kernel custom calls."""
    case = Case(64, 4, 2, 32, causal=True, alibi=True, segments=True)
    inputs = make_inputs(case)

    def loss(q, k, v):
        out = flash_attention(q, k, v, inputs["alibi_slopes"], inputs["segment_ids"],
                              case.head_dim ** -0.5, True, 16, 16, False)
        return jnp.sum(out.astype(jnp.float32) * inputs["cotangent"])

    lowered = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(
        inputs["q"], inputs["k"], inputs["v"]).lower(lowering_platforms=("cuda",))
    text = lowered.as_text()
    calls = re.findall(r"stablehlo\.custom_call @(\S+)\(", text)
    assert calls.count("__gpu$xla.gpu.triton") == 3, calls
    for name in ("flash_attention_forward", "flash_attention_dq", "flash_attention_dkv"):
        assert name in text
