"""FP8 on 8 H100s, compiled deviceless on this host: cuBLASLt FP8 GEMMs per layer and
the step's temporaries against bf16 (issue 25, items 3 and 5).

Each step compiles as calling it compiles it: fp8 with its precision's XLA options
(``jaxsmp.train.precision.FP8_COMPILER_OPTIONS``: no Triton GEMMs), bf16 with XLA's
defaults. The target config gets a CUDA runtime version (``runtime_version``): without
one XLA takes the toolkit to be 0.0.0, and its GEMM rewriter only emits FP8 cuBLASLt
calls from CUDA 12 on (the shipped H100 config has none).

    python bench/fp8_compile.py [--layers 2] [--seq 2048] [--mesh sdp=8 ...] [--reduce-dtype bf16]
"""
from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # no CUDA runtime here: compile deviceless

import argparse
import sys
from pathlib import Path

# bench/collectives.py would shadow the ``collectives`` package jaxsmp imports.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import jaxsmp  # noqa: E402
from jaxsmp.checkpoint import abstract_state  # noqa: E402
from jaxsmp.losses import causal_lm_loss  # noqa: E402
from jaxsmp.plan import gpu_target  # noqa: E402
from jaxsmp.train.precision import FP8_COMPILER_OPTIONS  # noqa: E402

MiB = 2 ** 20


def compile_step(config, degrees: dict, precision: str, *, gpu: str = "H100-SXM",
                 batch: int = 8, seq: int = 256, compiler_options: dict | None = None,
                 **options):
    """The train step of ``config`` compiled for ``gpu`` x 8 on mesh ``degrees``, as
    calling it compiles it (``compiler_options``: more XLA options on top)."""
    mesh = jaxsmp.Mesh(**degrees, devices=gpu_target.topology(gpu))
    state = abstract_state(config.build, optax.adamw(1e-4), mesh)
    tokens = {"tokens": jax.ShapeDtypeStruct((batch, seq), np.int32)}
    step = jaxsmp.step(causal_lm_loss, precision=precision, **options)
    return gpu_target.compile_step(step, state, tokens, mesh, compiler_options)


def count_fp8_gemms(compiled) -> int:
    return gpu_target.count_fp8_gemms(compiled.as_text())


def fp8_gemm_split(compiled) -> str:
    """FP8 GEMM call sites per computation, e.g. ``7 + 40``: the forward layer loop's
    body (run once per layer) and the rest (XLA unrolls a 2-layer backward)."""
    counts = gpu_target.gemms_per_computation(compiled.as_text())
    return " + ".join(str(n) for n in sorted(c[gpu_target.FP8_GEMM] for c in counts if c))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--mesh", nargs="+", default=["sdp=8", "sdp=4,tp=2"])
    parser.add_argument("--remat", default="full")
    parser.add_argument("--reduce-dtype", choices=["bf16", "fp32"],
                        help="every step's gradient reduction (default: each precision's)")
    args = parser.parse_args(argv)
    options = dict(seq=args.seq, remat=args.remat, reduce_dtype=args.reduce_dtype)
    print("| model | mesh | fp8 GEMM call sites | per computation | bf16 temporaries MiB "
          "| fp8 temporaries MiB | fp8 / bf16 | bf16 without Triton GEMMs MiB | fp8 / that |"
          "\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for family, preset in (("gpt_neox", "125m"), ("llama", "7b")):
        config = jaxsmp.models.preset(family, preset, num_hidden_layers=args.layers,
                                      attention_impl="cudnn")
        for mesh in args.mesh:
            degrees = {k: int(v) for k, v in (p.split("=") for p in mesh.split(","))}
            out = {p: compile_step(config, degrees, p, **options) for p in ("bf16", "fp8")}
            # bf16 on fp8's GEMM backend (cuBLAS, its precision's XLA options)
            out["cublas"] = compile_step(config, degrees, "bf16", **options,
                                         compiler_options=dict(FP8_COMPILER_OPTIONS))
            temp = {p: c.memory_analysis().temp_size_in_bytes / MiB for p, c in out.items()}
            print(f"| {family} {preset} x{args.layers} | {mesh} | "
                  f"{count_fp8_gemms(out['fp8'])} | {fp8_gemm_split(out['fp8'])} | "
                  f"{temp['bf16']:.0f} | {temp['fp8']:.0f} | "
                  f"{temp['fp8'] / temp['bf16']:.3f} | {temp['cublas']:.0f} | "
                  f"{temp['fp8'] / temp['cublas']:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
