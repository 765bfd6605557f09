"""Section 2: attention forward + backward TFLOP/s, causal, bf16, per kernel.

``pallas_kernels.attention.attention`` with ``impl`` pallas (Triton), cudnn, blockwise and
reference; 32,768 tokens per call (batch 16 / 4 / 1 at 2k / 8k / 32k), 2,048 features
(32 heads of 64 or 16 of 128); then with ALiBi slopes at head dim 128 (cuDNN takes none)."""
from __future__ import annotations

TITLE = "2. Attention forward + backward"
ISOLATE = False
COLUMNS = [("impl", "kernel", ""), ("alibi", "ALiBi", ""), ("seq", "seq", ""),
           ("batch", "batch", ""), ("heads", "heads", ""), ("head_dim", "head dim", ""),
           ("ms", "fwd+bwd ms", ".3f"), ("tflops", "TFLOP/s", ".4g"),
           ("first_call_s", "compile+1st s", ".1f")]
NOTES = """FLOPs per call: 4·b·h·s²·d forward, halved for causal, times 3.5 for forward +
backward (FlashAttention's convention: the backward runs 5 of the forward's 2 matmuls).
`fwd+bwd ms`: one jitted forward and `vjp` over q, k, v, bfloat16; calls are launched
back to back and waited for once. The reference kernel recomputes its scores in the
backward pass (`pallas_kernels.attention._reference`)."""

IMPLS = ("pallas", "cudnn", "blockwise", "reference")
GPU = {"tokens": 32768, "width": 2048, "seqs": (2048, 8192, 32768), "dims": (64, 128)}
SMOKE = {"tokens": 128, "width": 64, "seqs": (64,), "dims": (16, 32)}
REFERENCE_LIMIT = 16 * 2**30   # the reference kernel's float32 scores, at most
GOAL_SEQ = 8192   # Pallas against cuDNN is judged at 8k tokens


def rows(ctx: dict, results: dict) -> list[dict]:
    shape = SMOKE if ctx["smoke"] else GPU
    out = []
    for alibi in (False, True):
        for seq in shape["seqs"]:
            for dim in shape["dims"][-1:] if alibi else shape["dims"]:
                for impl in IMPLS:
                    batch, heads = max(1, shape["tokens"] // seq), shape["width"] // dim
                    out.append({"impl": impl, "alibi": alibi, "seq": seq, "batch": batch,
                                "heads": heads, "head_dim": dim,
                                "label": f"{impl}{' alibi' if alibi else ''} s={seq} d={dim}"})
    # the first GPU run reached 15 of 36 rows in 380 s (each compiles; blockwise 45 s):
    # Pallas and cuDNN first, at the goal's sequence length first, then the rest
    return sorted(out, key=lambda r: (r["impl"] in ("blockwise", "reference"),
                                      r["seq"] != GOAL_SEQ))


def flops(row: dict) -> float:
    forward = 4 * row["batch"] * row["heads"] * row["seq"] ** 2 * row["head_dim"] / 2
    return 3.5 * forward


def _refusal(row: dict, platform: str) -> str | None:
    if row["impl"] == "cudnn" and row["alibi"]:
        return "cuDNN's kernel takes no ALiBi slopes"
    if row["impl"] == "cudnn" and platform != "gpu":
        return "cuDNN needs an NVIDIA GPU"
    scores = 4 * row["batch"] * row["heads"] * row["seq"] ** 2
    if row["impl"] == "reference" and scores > REFERENCE_LIMIT:
        return f"its float32 scores would take {scores / 2**30:.0f} GiB"
    return None


def run(row: dict, ctx: dict, deadline: float) -> dict:
    import jax
    import jax.numpy as jnp

    from bench.gpucheck.common import Skip, time_loop
    from pallas_kernels.alibi import alibi_slopes
    from pallas_kernels.attention import attention
    why = _refusal(row, ctx["env"]["platform"])
    if why:
        raise Skip(why)
    keys = jax.random.split(jax.random.key(0), 4)
    shape = (row["batch"], row["seq"], row["heads"], row["head_dim"])
    q, k, v, do = (jax.random.normal(key, shape, jnp.bfloat16) for key in keys)
    slopes = jnp.asarray(alibi_slopes(row["heads"])) if row["alibi"] else None

    @jax.jit
    def fwd_bwd(q, k, v):
        out, vjp = jax.vjp(lambda q, k, v: attention(
            q, k, v, causal=True, alibi_slopes=slopes, impl=row["impl"]), q, k, v)
        return out, vjp(do)
    timing = time_loop(lambda: fwd_bwd(q, k, v), jax.block_until_ready, deadline=deadline,
                       target_s=ctx["target_s"] / 4)
    return {**timing, "tflops": flops(row) / timing["call_s"] / 1e12,
            "ms": timing["call_s"] * 1e3}
