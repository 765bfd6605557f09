"""Shared test helpers: random attention inputs and a float64 reference with gradients."""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels.alibi import alibi_slopes
from pallas_kernels.reference import attention_reference


@dataclasses.dataclass(frozen=True)
class Case:
    seq: int
    heads: int
    kv_heads: int
    head_dim: int
    causal: bool
    alibi: bool
    segments: bool
    dtype: str = "float32"
    block_q: int = 16
    block_k: int = 16
    seed: int = 0
    batch: int = 2

    def __str__(self) -> str:
        flags = "".join(c for c, on in (("c", self.causal), ("a", self.alibi),
                                        ("s", self.segments)) if on)
        return (f"s{self.seq}h{self.heads}kv{self.kv_heads}d{self.head_dim}-{flags or 'plain'}-"
                f"{self.dtype}-b{self.block_q}x{self.block_k}")


def make_inputs(case: Case) -> dict:
    """Fresh normal q, k, v and output cotangent; Bloom ALiBi slopes; random packing."""
    kq, kk, kv, kc, ks = jax.random.split(jax.random.key(case.seed), 5)
    dtype = jnp.dtype(case.dtype)
    q_shape = (case.batch, case.seq, case.heads, case.head_dim)
    kv_shape = (case.batch, case.seq, case.kv_heads, case.head_dim)
    inputs = {
        "q": jax.random.normal(kq, q_shape).astype(dtype),
        "k": jax.random.normal(kk, kv_shape).astype(dtype),
        "v": jax.random.normal(kv, kv_shape).astype(dtype),
        "cotangent": jax.random.normal(kc, q_shape).astype(dtype),
        "alibi_slopes": jnp.asarray(alibi_slopes(case.heads)) if case.alibi else None,
        "segment_ids": None,
    }
    if case.segments:
        starts = jax.random.bernoulli(ks, 0.08, (case.batch, case.seq))
        inputs["segment_ids"] = jnp.cumsum(starts, axis=1).astype(jnp.int32)
    return inputs


def reference_f64(inputs: dict, causal: bool) -> tuple[np.ndarray, ...]:
    """(out, dq, dk, dv) of the plain softmax reference in float64 on the same inputs."""
    with jax.enable_x64(True):
        f64 = {n: jnp.asarray(np.asarray(inputs[n], np.float64)) for n in ("q", "k", "v")}
        slopes = inputs["alibi_slopes"]
        slopes = None if slopes is None else jnp.asarray(np.asarray(slopes, np.float64))

        def f(q, k, v):
            return attention_reference(q, k, v, causal=causal, alibi_slopes=slopes,
                                       segment_ids=inputs["segment_ids"])

        out, vjp = jax.vjp(f, f64["q"], f64["k"], f64["v"])
        assert out.dtype == jnp.float64
        grads = vjp(jnp.asarray(np.asarray(inputs["cotangent"], np.float64)))
        return tuple(np.asarray(x) for x in (out, *grads))


def output_and_grads(fn, inputs: dict) -> tuple[np.ndarray, ...]:
    """(out, dq, dk, dv) of fn(q, k, v) with the case's cotangent, as float64 numpy."""
    out, vjp = jax.vjp(fn, inputs["q"], inputs["k"], inputs["v"])
    grads = vjp(inputs["cotangent"])
    assert out.dtype == inputs["q"].dtype
    assert [g.dtype for g in grads] == [inputs[n].dtype for n in ("q", "k", "v")]
    return tuple(np.asarray(x, np.float64) for x in (out, *grads))


def relative_error(x: np.ndarray, ref: np.ndarray) -> float:
    """max |x - ref| / max |ref|: error relative to the array's scale."""
    assert np.all(np.isfinite(x))
    return float(np.max(np.abs(x - ref)) / np.max(np.abs(ref)))


def assert_matches_reference(fn, case: Case, tolerances: dict[str, float]) -> None:
    """Checks out, dq, dk, dv of fn against the float64 reference within tolerances[dtype]."""
    inputs = make_inputs(case)
    got = output_and_grads(fn(inputs), inputs)
    want = reference_f64(inputs, case.causal)
    errors = {name: relative_error(g, w) for name, g, w in zip(("out", "dq", "dk", "dv"),
                                                                got, want)}
    tol = tolerances[case.dtype]
    assert all(e <= tol for e in errors.values()), f"{case}: {errors} (tol {tol})"
