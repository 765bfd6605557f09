"""jaxsmp's compiled step against a hand-written GSPMD FSDP step, side by side, both
compiled deviceless by XLA:GPU for 8 x H100 on this host, read from the programs.

    python bench/fsdp_compare.py                 # Llama-2-7B width, 4 layers, seq 4096, sdp=8, remat full
    python bench/fsdp_compare.py --all           # + GPT-NeoX-20B width at seq 2048, sdp=4,tp=2, remat none
    python bench/fsdp_compare.py --work llama7b --mesh sdp=4,tp=2 --remat none \\
        --contenders jaxsmp jaxsmp-prefetch gspmd gspmd-stack [--json out.json] [--no-flags]

Contenders: ``jaxsmp`` (the step as configured by default, ``reduce_dtype`` from
``--reduce-dtype``), ``jaxsmp-prefetch`` (its own prefetch forced on), ``jaxsmp-fp32``
(float32 gradient reduction), ``gspmd`` (``bench/gspmd_fsdp.py``: weights cast per
layer inside the scan), ``gspmd-stack`` (the stack cast to bf16 before the scan) and
``gspmd-weights`` (every weight constrained whole inside the layer and the head: the
weights gathered rather than the layer activations, ZeRO-3's algorithm, as jaxsmp's).
The XLA flags jaxsmp sets on GPUs (``jaxsmp.xla_flags``) are set for every contender
(``--no-flags``: none). One sequence per GPU, bf16, cuDNN attention, AdamW.

Columns, per GPU: temporaries (``memory_analysis``); roofline time of the kernels by kind
(:mod:`jaxsmp.plan.hlo_cost`: GEMM, attention, memory-bound, launches) plus the
collectives no GEMM overlaps, priced on a p5.48xlarge; HBM bytes of the non-GEMM
kernels; kernels launched; collective bytes by kind and dtype; the bytes of the
collectives that run asynchronously with a GEMM between start and done.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# this folder's collectives.py would shadow the package of that name
_BENCH = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != _BENCH]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import jaxsmp  # noqa: E402
from jaxsmp import xla_flags  # noqa: E402
from jaxsmp.checkpoint import abstract_state  # noqa: E402
from jaxsmp.losses import causal_lm_loss  # noqa: E402
from jaxsmp.plan import gpu_target, hlo_cost, hlo_parse  # noqa: E402
from jaxsmp.plan.compiled_time import collective_seconds, rates  # noqa: E402
from jaxsmp.plan.hardware import GPUS, Cluster, node  # noqa: E402

sys.path.append(_BENCH)
import gspmd_fsdp  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30
# (family, preset, overrides, sequence): Llama-2-7B and GPT-NeoX-20B widths
WORKS = {"llama7b": ("llama", "7b", {}, 4096), "neox20b": ("gpt_neox", "20b", {}, 2048)}


def _set_flags(argv: list[str]) -> None:
    """jaxsmp's GPU flags in ``XLA_FLAGS`` before the backend starts (XLA reads them
    once), their combine thresholds sized to one layer of the largest selected work, as
    the trainer sizes them (``jaxsmp.cli.entry``); none with ``--no-flags``."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--work", nargs="+", default=["llama7b"])
    pre.add_argument("--all", action="store_true")
    pre.add_argument("--no-flags", action="store_true")
    known = pre.parse_known_args(argv)[0]
    if known.no_flags:
        return
    from jaxsmp.plan.workload import Workload
    works = sorted(WORKS) if known.all else [w for w in known.work if w in WORKS]
    layer = max((Workload(_config(w, 1)[0], 128).layer_params * 2 for w in works),
                default=xla_flags.DEFAULT_LAYER_BYTES)
    xla_flags.apply(layer, gpu=True)


CONTENDERS = ("jaxsmp", "jaxsmp-prefetch", "jaxsmp-fp32", "jaxsmp-never", "gspmd",
              "gspmd-stack", "gspmd-weights")


def _config(work: str, layers: int, seq: int | None = None):
    family, name, overrides, default_seq = WORKS[work]
    seq = seq or default_seq
    field = "num_hidden_layers"
    config = jaxsmp.models.preset(family, name, **overrides).replace(
        attention_impl="cudnn", **{field: layers})
    return config, seq


def _width(config) -> gspmd_fsdp.Width:
    mlp = getattr(config, "intermediate_size", None) or 4 * config.hidden_size
    return gspmd_fsdp.Width(config.vocab_size, config.hidden_size, config.num_attention_heads,
                            mlp, config.num_hidden_layers,
                            "gelu" if "neox" in type(config).__name__.lower() else "swiglu")


_set_flags(sys.argv[1:])


def compile_contender(contender: str, work: str, mesh: str, remat: str, layers: int,
                      reduce_dtype: str = "bf16", seq: int | None = None):
    degrees = {k: int(v) for k, v in (p.split("=") for p in mesh.split(","))}
    devices = gpu_target.topology("H100-SXM", gpus_per_host=8)
    config, seq = _config(work, layers, seq)
    batch = 8   # one sequence per GPU
    if contender.startswith("jaxsmp"):
        jmesh = jaxsmp.Mesh(**degrees, devices=devices)
        state = abstract_state(config.build, optax.adamw(1e-4), jmesh)
        options = dict(precision="bf16", remat=remat, reduce_dtype=reduce_dtype)
        if contender == "jaxsmp-prefetch":
            options["prefetch"] = True
        if contender == "jaxsmp-fp32":
            options["reduce_dtype"] = "fp32"
        if contender == "jaxsmp-never":   # ZeRO-3 weight gathers for every GEMM
            options["activation_gather"] = "never"
        step = jaxsmp.step(causal_lm_loss, **options)
        tokens = {"tokens": jax.ShapeDtypeStruct((batch, seq), np.int32)}
        return gpu_target.compile_step(step, state, tokens, jmesh)
    shape = {"fsdp": degrees.get("sdp", 1), "tp": degrees.get("tp", 1)}
    with gpu_target.compiling_for("H100-SXM"):
        return gspmd_fsdp.compile_step(devices, shape, _width(config), seq, batch, remat,
                                       cast="stack" if contender == "gspmd-stack" else "layer",
                                       gather="weights" if contender == "gspmd-weights"
                                       else "auto")


def analyse(compiled) -> dict:
    """What the program costs per GPU: memory, roofline by kind, HBM bytes, kernels,
    collective bytes by kind and dtype, and which collectives overlap a GEMM."""
    text = compiled.as_text()
    k = hlo_cost.estimate(text, rates(GPUS["H100-SXM"], "bf16"))
    cluster = Cluster(node("p5.48xlarge"))
    by_kind, exposed, overlapped, total = collections.Counter(), 0.0, 0.0, 0.0
    layer_sized = {"synchronous": [], "not overlapped": []}   # gathers / scatters >= 1 MiB
    for c, where in hlo_cost.exposed_collectives(text, rates(GPUS["H100-SXM"], "bf16")):
        if c.kind in ("all-gather", "reduce-scatter") and c.nbytes >= MiB and c.group_size > 1:
            name = f"{c.kind} {c.dtype} {c.nbytes / MiB:.0f} MiB ({where})"
            layer_sized["not overlapped"].append(name)
            if not c.asynchronous:
                layer_sized["synchronous"].append(name)
    for c in k.collectives:
        if c.group_size == 1:
            continue
        nbytes = c.nbytes * c.count
        by_kind[f"{c.kind} {c.dtype}"] += nbytes / GiB
        total += nbytes
        if c.overlapped:
            overlapped += nbytes
        else:
            exposed += collective_seconds(c, cluster)
    return {"temporaries_mib": compiled.memory_analysis().temp_size_in_bytes / MiB,
            "gemm_ms": k.matmul * 1e3, "attention_ms": k.attention * 1e3,
            "memory_ms": k.memory * 1e3, "launch_ms": k.launch * 1e3,
            "exposed_collectives_ms": exposed * 1e3,
            "step_ms": (k.compute + exposed) * 1e3, "hbm_gib": k.memory_bytes / GiB,
            "kernels": round(k.launch / hlo_cost.LAUNCH_SECONDS),
            "collective_gib": total / GiB, "overlapped_fraction": overlapped / max(total, 1),
            "collectives": {key: round(v, 3) for key, v in sorted(by_kind.items())},
            **layer_sized, **_memory_kernels(text, k)}


def _memory_kernels(text: str, k: hlo_cost.KernelTime) -> dict:
    """The memory-bound kernels' HBM GiB per step: by where they run (the layer loops or
    the entry computation) and whether they write float32, and the largest 40."""
    entry = hlo_parse.parse(text)[1]
    where = collections.Counter()
    for key, nbytes in k.memory_kernels.items():
        comp, shape = key.split("/", 1)[0], key.split(" ", 1)[1]
        where[f"{'entry' if comp == entry else 'loops'}, "
              f"{'float32' if 'f32[' in shape else 'other'} results"] += nbytes / GiB
    largest = sorted(k.memory_kernels.items(), key=lambda item: -item[1])[:40]
    return {"hbm_gib_by_place": {key: round(v, 3) for key, v in sorted(where.items())},
            "largest_memory_kernels_gib": [(key, round(v / GiB, 3)) for key, v in largest]}


HEADER = ("| work | mesh | remat | contender | temporaries MiB | step ms (GEMM / attn / mem / "
          "launch / exposed coll.) | HBM GiB | kernels | collective GiB | overlapped | "
          "by kind and dtype (GiB) |\n|---|---|---|---|---|---|---|---|---|---|---|")


def row(r: dict) -> str:
    kinds = ", ".join(f"{k} {v:.2f}" for k, v in r["collectives"].items() if v >= 0.005)
    return (f"| {r['work']} x{r['layers']} | {r['mesh']} | {r['remat']} | {r['contender']} | "
            f"{r['temporaries_mib']:.0f} | {r['step_ms']:.1f} ({r['gemm_ms']:.1f} / "
            f"{r['attention_ms']:.1f} / {r['memory_ms']:.1f} / {r['launch_ms']:.1f} / "
            f"{r['exposed_collectives_ms']:.1f}) | {r['hbm_gib']:.1f} | {r['kernels']} | "
            f"{r['collective_gib']:.2f} | {r['overlapped_fraction']:.0%} | {kinds} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", nargs="+", default=["llama7b"], choices=sorted(WORKS))
    p.add_argument("--mesh", nargs="+", default=["sdp=8"])
    p.add_argument("--remat", nargs="+", default=["full"])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seq", type=int, help="sequence length (default: the work's)")
    p.add_argument("--contenders", nargs="+", default=["jaxsmp", "gspmd"], choices=CONTENDERS)
    p.add_argument("--reduce-dtype", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--all", action="store_true", help="both works, both meshes, full and none")
    p.add_argument("--no-flags", action="store_true", help="compile without jaxsmp's XLA flags")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--kernels", type=int, default=0, metavar="N",
                   help="after each row, its memory-bound HBM bytes by place and its N "
                        "largest memory-bound kernels (bytes x loop trips)")
    args = p.parse_args(argv)
    if args.all:
        args.work, args.mesh, args.remat = sorted(WORKS), ["sdp=8", "sdp=4,tp=2"], ["full", "none"]
    print(f"jax {jax.__version__}, 8 x H100-SXM (deviceless XLA:GPU), "
          f"{'no XLA flags' if args.no_flags else 'jaxsmp XLA flags'}", flush=True)
    print(HEADER, flush=True)
    results = []
    for work in args.work:
        for mesh in args.mesh:
            for remat in args.remat:
                for contender in args.contenders:
                    start = time.perf_counter()
                    compiled = compile_contender(contender, work, mesh, remat, args.layers,
                                                 args.reduce_dtype, args.seq)
                    r = dict(work=work, mesh=mesh, remat=remat, contender=contender,
                             layers=args.layers, compile_s=time.perf_counter() - start,
                             **analyse(compiled))
                    results.append(r)
                    print(row(r), flush=True)
                    if args.kernels:
                        print(f"  memory-bound GiB by place: {r['hbm_gib_by_place']}")
                        for key, gib in r["largest_memory_kernels_gib"][:args.kernels]:
                            print(f"  {gib:7.3f}  {key[:150]}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
