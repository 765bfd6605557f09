"""The reference attention against a direct numpy float64 loop over batch and heads."""
from __future__ import annotations

import numpy as np
import pytest
from attention_cases import Case, make_inputs

from pallas_kernels.reference import attention_reference


def _numpy_attention(q, k, v, *, causal, slopes, segment_ids) -> np.ndarray:
    b, s, h, d = q.shape
    groups = h // k.shape[2]
    out = np.zeros_like(q)
    pos = np.arange(s)
    for bi in range(b):
        for hi in range(h):
            scores = q[bi, :, hi] @ k[bi, :, hi // groups].T / np.sqrt(d)
            if slopes is not None:
                scores = scores + slopes[hi] * (pos[None, :] - pos[:, None])
            allowed = np.ones((s, s), bool)
            if causal:
                allowed &= pos[:, None] >= pos[None, :]
            if segment_ids is not None:
                allowed &= segment_ids[bi][:, None] == segment_ids[bi][None, :]
            scores = np.where(allowed, scores, -np.inf)
            p = np.exp(scores - scores.max(axis=1, keepdims=True))
            out[bi, :, hi] = (p / p.sum(axis=1, keepdims=True)) @ v[bi, :, hi // groups]
    return out


@pytest.mark.parametrize("case", [
    Case(32, 4, 2, 16, causal=True, alibi=True, segments=True, seed=20),
    Case(48, 3, 1, 8, causal=False, alibi=True, segments=False, seed=21),
    Case(16, 2, 2, 8, causal=False, alibi=False, segments=True, seed=22),
], ids=str)
def test_matches_numpy_loop(case: Case) -> None:
    inputs = make_inputs(case)
    as64 = {n: None if inputs[n] is None else np.asarray(inputs[n], np.float64)
            for n in ("q", "k", "v", "alibi_slopes")}
    seg = None if inputs["segment_ids"] is None else np.asarray(inputs["segment_ids"])
    want = _numpy_attention(as64["q"], as64["k"], as64["v"], causal=case.causal,
                            slopes=as64["alibi_slopes"], segment_ids=seg)
    got = attention_reference(inputs["q"], inputs["k"], inputs["v"], causal=case.causal,
                              alibi_slopes=inputs["alibi_slopes"],
                              segment_ids=inputs["segment_ids"])
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-5, rtol=2e-5)
