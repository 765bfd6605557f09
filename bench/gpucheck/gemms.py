"""Section 4: the rates of single GEMMs, bf16 against float8, at the Linears' shapes of the
measured models. The planner prices ``precision="fp8"``'s Linears at the data sheet's
float8 peak times the efficiency it fits for bf16 (``GPU.linear_flops``); the ratio
measured here is that assumption's check.

Each GEMM is one ``jax.jit`` call, launched back to back and waited for once
(``common.time_loop``). bf16: ``x @ w`` in bfloat16. float8: operands already in
float8 in memory, dequantized (:func:`jaxsmp.nn.fp8.dequantize`) right before the dot,
the pattern XLA's GEMM rewriter turns into one cuBLASLt FP8 GEMM when compiled with
the fp8 step's options (``PRECISIONS["fp8"].compiler_options``); ``fp8 TN`` holds the
kernel as ``[out, in]`` (cuBLASLt's native FP8 layout), ``fp8 NN`` as jaxsmp's Linear
does (``[in, out]``, which the compiled program may transpose first); ``bf16 cuBLAS`` is
bf16 compiled with the fp8 step's options (no Triton GEMMs), as an fp8 step runs the
GEMMs it leaves in bf16; ``fp8 e5m2`` is an input-gradient GEMM (``dy @ w.T`` with
jaxsmp's ``[in, out]`` kernel, ``dy`` in ``float8_e5m2``)."""
from __future__ import annotations

TITLE = "4. GEMM rates, bf16 and float8"
ISOLATE = False
COLUMNS = [("shape", "GEMM (tokens x in -> out)", ""), ("kind", "kind", ""),
           ("ms", "ms", ".4f"), ("tflops", "TFLOP/s", ".1f"),
           ("vs_bf16", "rate / bf16's", ".2f"), ("fp8_gemms", "FP8 GEMM calls", ""),
           ("first_call_s", "compile+1st s", ".1f")]
NOTES = """`rate / bf16's` divides by the bf16 row of the same shape (the data sheets' float8
peak is twice bf16's). FP8 GEMM calls counts `__cublas$lt$matmul$f8` in the compiled
call: 0 on a float8 row means XLA ran the dot another way, and its rate is not cuBLASLt's
float8 rate. XLA:CPU has no cuBLASLt (`--smoke`)."""

KINDS = ("bf16", "bf16 cuBLAS", "fp8 TN", "fp8 NN", "fp8 e5m2")
# (tokens, in, out): GPT-NeoX 1.3b at 16,384 tokens, Llama 2 7b width and BLOOM 1b7 at 8,192
GPU_SHAPES = ((16384, 2048, 6144), (16384, 2048, 8192), (16384, 8192, 2048),
              (8192, 4096, 12288), (8192, 4096, 11008), (8192, 11008, 4096),
              (8192, 8192, 8192))
SMOKE_SHAPES = ((128, 64, 192),)
_BF16_TFLOPS: dict[str, float] = {}   # this worker's bf16 rows (one worker runs them all)


def rows(ctx: dict, results: dict) -> list[dict]:
    shapes = SMOKE_SHAPES if ctx["smoke"] else GPU_SHAPES
    return [{"m": m, "k": k, "n": n, "kind": kind, "shape": f"{m} x {k} -> {n}",
             "label": f"gemm {m}x{k}x{n} {kind}"} for m, k, n in shapes for kind in KINDS]


def operands(row: dict):
    """The call and its arguments (random, fixed seed), built on the default device."""
    import jax
    import jax.numpy as jnp

    from jaxsmp.nn import fp8
    m, k, n, kind = row["m"], row["k"], row["n"], row["kind"]
    keys = jax.random.split(jax.random.key(0), 2)
    x = jax.random.normal(keys[0], (m, n if kind == "fp8 e5m2" else k), jnp.bfloat16)
    w = jax.random.normal(keys[1], (n, k) if kind == "fp8 TN" else (k, n), jnp.bfloat16)
    if kind.startswith("bf16"):
        return jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.bfloat16)), (x, w)
    x_dtype = fp8.BACKWARD_DTYPE if kind == "fp8 e5m2" else fp8.FORWARD_DTYPE
    scale = jnp.float32(0.5)
    contract = {"fp8 NN": ((1,), (0,)), "fp8 TN": ((1,), (1,)), "fp8 e5m2": ((1,), (1,))}[kind]

    def call(a, b, sa, sb):
        a, b = fp8.dequantize(a, sa, jnp.bfloat16), fp8.dequantize(b, sb, jnp.bfloat16)
        return jax.lax.dot_general(a, b, (contract, ((), ())),
                                   preferred_element_type=jnp.bfloat16)
    return jax.jit(call), (x.astype(x_dtype), w.astype(fp8.FORWARD_DTYPE), scale, scale)


def run(row: dict, ctx: dict, deadline: float) -> dict:
    from bench.gpucheck.common import time_loop
    from jaxsmp.plan.gpu_target import count_fp8_gemms
    from jaxsmp.train.precision import PRECISIONS
    call, args = operands(row)   # compiled as a step of its precision is
    options = PRECISIONS["bf16" if row["kind"] == "bf16" else "fp8"].compiler_options
    call = call.lower(*args).compile(options)
    timing = time_loop(lambda: call(*args), lambda y: y.block_until_ready(),
                       deadline=deadline, target_s=0.1 if ctx["smoke"] else 0.3,
                       max_iters=200)
    flops = 2.0 * row["m"] * row["k"] * row["n"]
    out = {"ms": timing["call_s"] * 1e3, "tflops": flops / timing["call_s"] / 1e12,
           "first_call_s": timing["first_call_s"],
           "fp8_gemms": count_fp8_gemms(call.as_text())}
    if row["kind"] == "bf16":
        _BF16_TFLOPS[row["shape"]] = out["tflops"]
    elif row["shape"] in _BF16_TFLOPS:
        out["vs_bf16"] = out["tflops"] / _BF16_TFLOPS[row["shape"]]
    return out
