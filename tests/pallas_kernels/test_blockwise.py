"""Blockwise XLA attention against a float64 reference."""
from __future__ import annotations

import itertools

import jax.numpy as jnp
import numpy as np
import pytest
from attention_cases import Case, assert_matches_reference, make_inputs

from pallas_kernels.blockwise import blockwise_attention

# max |err| / max |ref| for the output and each gradient, ~6x above the worst observed
# (float32 1.6e-6, bfloat16 4.7e-3).
TOLERANCES = {"float32": 1e-5, "bfloat16": 3e-2}

# (heads, kv_heads): MHA, GQA with 3 query heads per kv head, MQA.
HEAD_LAYOUTS = [(4, 4), (6, 2), (4, 1)]
# (seq, head_dim, block_q, block_k), cycled over the flag combinations.
GEOMETRIES = [(64, 32, 16, 32), (128, 16, 32, 16), (96, 64, 32, 32), (32, 16, 32, 8)]

# Every (causal, alibi, segments) combination; head layouts and geometries rotate through them.
CASES = [
    Case(seq, heads, kv_heads, head_dim, causal=causal, alibi=alibi, segments=segments,
         block_q=block_q, block_k=block_k, seed=seed)
    for seed, (causal, alibi, segments) in enumerate(itertools.product((False, True),
                                                                       repeat=3))
    for (heads, kv_heads), (seq, head_dim, block_q, block_k) in [
        (HEAD_LAYOUTS[seed % len(HEAD_LAYOUTS)], GEOMETRIES[seed % len(GEOMETRIES)])]
] + [
    Case(64, 6, 2, 32, causal=True, alibi=True, segments=True, dtype="bfloat16", seed=100),
    Case(128, 4, 1, 64, causal=False, alibi=False, segments=True, dtype="bfloat16",
         block_q=64, block_k=32, seed=101),
    Case(64, 4, 4, 16, causal=True, alibi=False, segments=False, dtype="bfloat16",
         block_q=64, block_k=64, seed=102),
]


def _blockwise(case: Case):
    def build(inputs):
        def fn(q, k, v):
            return blockwise_attention(q, k, v, inputs["alibi_slopes"], inputs["segment_ids"],
                                       case.head_dim ** -0.5, case.causal, case.block_q,
                                       case.block_k)
        return fn
    return build


@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_float64_reference(case: Case) -> None:
    assert_matches_reference(_blockwise(case), case, TOLERANCES)


def test_causal_skips_fully_masked_key_blocks() -> None:
    """NaN values in keys after the first block must not reach the first query block."""
    case = Case(64, 2, 1, 16, causal=True, alibi=False, segments=False, seed=9)
    inputs = make_inputs(case)
    v = inputs["v"].at[:, 16:].set(jnp.nan)
    out = blockwise_attention(inputs["q"], inputs["k"], v, None, None, 0.25, True, 16, 16)
    assert np.all(np.isfinite(np.asarray(out[:, :16])))
    assert np.all(np.isnan(np.asarray(out[:, 16:])))
