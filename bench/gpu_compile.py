"""Compile the whole train step for 8 GPUs on this CPU host (deviceless XLA:GPU) and
print, per case, the compile time, XLA:GPU's per-device memory and the kernels the
compiled step calls.

    python bench/gpu_compile.py                        # the default cases below
    python bench/gpu_compile.py --family llama --attention cudnn --precision bf16 \\
        --mesh sdp=4,tp=2 --remat offload --gpu H100-SXM [--json out.json]

Needs ``jax-cuda12-plugin`` of the installed jaxlib's version (the ``test`` extra).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# this folder's collectives.py would shadow the package of that name
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import jaxsmp  # noqa: E402
from jaxsmp.checkpoint import abstract_state  # noqa: E402
from jaxsmp.losses import causal_lm_loss  # noqa: E402
from jaxsmp.plan import gpu_target  # noqa: E402
from jaxsmp.plan.compiled import layer_field  # noqa: E402

MiB = 1 << 20
# head dims 64 (GPT-NeoX 125m, Bloom 560m with ALiBi) and 128 (Llama 2 7b made grouped-query)
PRESETS = {"gpt_neox": ("125m", {}), "bloom": ("560m", {}),
           "llama": ("7b", {"num_key_value_heads": 8})}
SEQ = 2048
KERNELS = {"cudnn": "__cudnn$fmha", "triton": "__gpu$xla.gpu.triton"}


def model_config(family: str, attention: str, layers: int = 2, seq: int = SEQ):
    name, overrides = PRESETS[family]
    config = jaxsmp.models.preset(family, name, **overrides)
    config = config.replace(attention_impl=attention, **{layer_field(config): layers})
    if hasattr(config, "max_position_embeddings"):
        config = config.replace(max_position_embeddings=max(seq, config.max_position_embeddings))
    return config


def parse_mesh(text: str) -> dict:
    return {k: int(v) for k, v in (part.split("=") for part in text.split(","))}


def compile_case(family: str, attention: str, precision: str, mesh: str, remat: str = "full",
                 gpu: str = "H100-SXM", sequence_parallel: bool = False, batch: int = 8,
                 pipeline: str = "interleaved", layers: int = 2, seq: int = SEQ,
                 context_parallel: str = "auto") -> dict:
    """One deviceless compile; its memory, time and kernels as a dict."""
    degrees = parse_mesh(mesh)
    devices = gpu_target.topology(gpu, gpus_per_host=8)
    jmesh = jaxsmp.Mesh(**degrees, devices=devices)
    config = model_config(family, attention, layers, seq)
    state = abstract_state(config.build, optax.adamw(1e-4), jmesh)
    tokens = {"tokens": jax.ShapeDtypeStruct((batch, seq), np.int32)}
    options = dict(precision=precision, remat=remat, sequence_parallel=sequence_parallel)
    if degrees.get("cp", 1) > 1:
        options.update(context_parallel=context_parallel)
    if degrees.get("pp", 1) > 1:
        options.update(microbatches=2, pipeline=pipeline)
    start = time.perf_counter()
    compiled = gpu_target.compile_step(jaxsmp.step(causal_lm_loss, **options), state, tokens,
                                       jmesh)
    seconds = time.perf_counter() - start
    stats, text = compiled.memory_analysis(), compiled.as_text()
    calls = re.findall(r'custom_call_target="([^"]+)"', text)
    return {"family": family, "attention": attention, "precision": precision, "mesh": mesh,
            "remat": remat, "sequence_parallel": sequence_parallel, "gpu": gpu, "seq": seq,
            "compile_s": round(seconds, 1),
            "arguments_mib": stats.argument_size_in_bytes / MiB,
            "temporaries_mib": stats.temp_size_in_bytes / MiB,
            "host_temporaries_mib": getattr(stats, "host_temp_size_in_bytes", 0) / MiB,
            "host_buffers": text.count("S(5)"),
            "kernels": {k: sum(c.startswith(v) for c in calls) for k, v in KERNELS.items()}}


DEFAULT_CASES = [  # family, attention, precision, mesh, remat
    ("gpt_neox", "cudnn", "bf16", "sdp=8", "full"),
    ("gpt_neox", "cudnn", "bf16", "sdp=4,tp=2", "full"),
    ("gpt_neox", "auto", "bf16", "dp=2,sdp=4", "none"),
    ("gpt_neox", "pallas", "fp32", "tp=8", "full"),
    ("gpt_neox", "cudnn", "bf16", "pp=2,sdp=4", "full"),
    ("bloom", "auto", "bf16", "sdp=4,tp=2", "full"),
    ("llama", "cudnn", "fp16", "sdp=4,tp=2", "none"),
    ("llama", "pallas", "bf16", "sdp=8", "full"),
    ("gpt_neox", "cudnn", "bf16", "sdp=8", "save_matmuls"),
    ("gpt_neox", "cudnn", "bf16", "sdp=8", "offload"),
]


def row(r: dict) -> str:
    kernels = ", ".join(f"{k} {n}" for k, n in r["kernels"].items() if n)
    return (f"| {r['family']} | {r['attention']} | {r['precision']} | {r['mesh']}"
            f"{' +sp' if r['sequence_parallel'] else ''} | {r['remat']} | {r['compile_s']} | "
            f"{r['arguments_mib']:.0f} | {r['temporaries_mib']:.0f} | "
            f"{r['host_temporaries_mib']:.0f} | {kernels} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--family", nargs="+")
    p.add_argument("--attention", nargs="+", default=["auto"])
    p.add_argument("--precision", nargs="+", default=["bf16"])
    p.add_argument("--mesh", nargs="+", default=["sdp=8"])
    p.add_argument("--remat", nargs="+", default=["full"])
    p.add_argument("--gpu", default="H100-SXM", choices=sorted(gpu_target.TARGETS))
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument("--seq", type=int, default=SEQ, help="sequence length")
    p.add_argument("--context-parallel", default="auto", help="with a cp mesh: ulysses, ring")
    p.add_argument("--batch", type=int, default=8, help="global batch in sequences")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    cases = DEFAULT_CASES if not args.family else list(itertools.product(
        args.family, args.attention, args.precision, args.mesh, args.remat))
    print(f"jax {jax.__version__}, {args.gpu} x 8, seq {args.seq}, 2 layers", flush=True)
    print("| family | attention | precision | mesh | remat | compile s | arguments MiB | "
          "temporaries MiB | host MiB | kernels |\n|---|---|---|---|---|---|---|---|---|---|")
    results = []
    for case in cases:
        r = compile_case(*case, gpu=args.gpu, sequence_parallel=args.sequence_parallel,
                         seq=args.seq, batch=args.batch, context_parallel=args.context_parallel)
        results.append(r)
        print(row(r), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
