"""Section 6: where a step's time goes. jaxsmp's step traced with ``jax.profiler`` on the
GPU; every kernel is matched to the instruction of the compiled program that launched
it (its ``hlo_op``) and counted as a GEMM, fused attention or memory-bound work, as
:mod:`jaxsmp.plan.hlo_cost` counts it. The program's GEMM FLOPs, attention FLOPs and
memory-bound bytes per step (``hlo_cost``, loop bodies times their trips) over the
kernels' seconds give the rates the step reached: what the time model's constants
stand for, measured inside the step instead of fitted."""
from __future__ import annotations

import collections
import glob
import re
import tempfile

TITLE = "6. Where a step's time goes"
ISOLATE = True
COLUMNS = [("model", "model", ""), ("seq", "seq", ""), ("batch", "batch", ""),
           ("remat", "remat", ""), ("precision", "precision", ""), ("step_s", "step s", ".4f"),
           ("busy_s", "kernels s", ".4f"), ("gemm_s", "GEMM s", ".4f"),
           ("attention_s", "attention s", ".4f"), ("memory_s", "memory-bound s", ".4f"),
           ("other_s", "unmatched s", ".4f"), ("gemm_tflops", "GEMM TFLOP/s", ".0f"),
           ("attention_tflops", "attention TFLOP/s", ".0f"),
           ("memory_gbps", "memory-bound GB/s", ".0f")]
NOTES = """Seconds are per step: the kernels' durations on the GPU over the traced steps
(`kernels s` against the timed `step s` shows the gaps between kernels). Rates divide
the compiled program's work (`jaxsmp.plan.hlo_cost`: GEMM FLOPs, attention FLOPs as
FlashAttention counts them, bytes of the other kernels) by the matched kernels' seconds
(memory-bound bytes over the memory-bound kernels' and the copies' seconds: XLA runs some
in-place updates as copies).
`unmatched`: kernels neither found in the program nor named as a library's GEMM or
attention kernels (none expected); the row's JSON lists them, and each category's
longest kernels.
XLA:CPU's trace has no device kernels (`--smoke`: zeros)."""

TRACED_STEPS = 3
DERIVED_LINES = ("XLA Modules", "XLA Ops", "Steps", "Launch Stats", "Source", "TensorFlow")


def rows(ctx: dict, results: dict) -> list[dict]:
    from bench.gpucheck.training import fit_layers, model_row
    smoke = ctx["smoke"]
    memory = 2 * 2**30 if smoke else ctx["env"]["jax_bytes_limit_gib"] * 2**30
    neox = model_row("gpt_neox", "tiny" if smoke else "1.3b", 64 if smoke else 2048,
                     2 if smoke else 8, 4 if smoke else 24, smoke)
    out = [{**neox, "remat": r, "precision": p} for r, p in
           (("none", "bf16"), ("full", "bf16"), ("save_matmuls", "bf16"), ("none", "fp8"))]
    for family, preset in (("llama", "7b"), ("bloom", "1b7")):
        name = "tiny" if smoke else preset
        seq, batch = (64, 2) if smoke else (2048, 4)
        layers = fit_layers(family, name, seq, batch, memory)
        out.append({**model_row(family, name, seq, batch, layers, smoke),
                    "remat": "none", "precision": "bf16"})
    return [{**r, "contender": "jaxsmp", "label": f"{r['model']} x{r['layers']} seq "
             f"{r['seq']} remat={r['remat']} {r['precision']} kernels"} for r in out]


LIBRARY = (("gemm", re.compile(r"gemm|xmma|nvjet|cutlass|cublas", re.I)),
           ("attention", re.compile(r"fmha|flash|sdpa|cudnn|attention", re.I)),
           ("collective", re.compile(r"nccl", re.I)),
           ("copy", re.compile(r"memcpy|memset", re.I)))


def kind_of(event, kinds: dict[str, str]) -> str | None:
    """A kernel's category: by the instruction its annotation names (``hlo_op``), else
    by its name (XLA names a fusion's kernel after the fusion, dots as underscores), else
    by a library's kernel naming (cuBLAS, cuDNN, Triton's FlashAttention); None: unknown."""
    stats = {k: str(v) for k, v in event.stats}
    names = [n for n in re.split(r"[,;\s]+", stats.get("hlo_op", "")) if n][::-1]
    names += [event.name, event.name.split("(")[0].strip()]
    for name in names:
        kind = kinds.get(name) or kinds.get(name.replace(".", "_"))
        if kind:
            return kind
    for kind, pattern in LIBRARY:
        if pattern.search(event.name):
            return kind
    return None


def kernel_seconds(trace_dir: str, kinds: dict[str, str]) -> tuple[dict, dict, dict]:
    """(seconds per category, seconds per unknown kernel name, the longest kernels per
    category: name to seconds) over every GPU kernel of the trace in ``trace_dir``."""
    from jax.profiler import ProfileData
    kinds = {**kinds, **{k.replace(".", "_"): v for k, v in kinds.items()}}
    seconds, unknown = collections.Counter(), collections.Counter()
    named: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for path in glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True):
        for plane in ProfileData.from_file(path).planes:
            if not plane.name.startswith("/device:GPU"):
                continue
            for line in plane.lines:
                if line.name.startswith(DERIVED_LINES):
                    continue
                for event in line.events:
                    kind = kind_of(event, kinds)
                    if kind is None:
                        unknown[event.name] += event.duration_ns * 1e-9
                    else:
                        seconds[kind] += event.duration_ns * 1e-9
                        named[kind][event.name[:60]] += event.duration_ns * 1e-9
    return seconds, unknown, {k: dict(v.most_common(6)) for k, v in named.items()}


def run(row: dict, ctx: dict, deadline: float) -> dict:
    import jax

    from bench.gpucheck.jax_steps import measure_jaxsmp
    from jaxsmp.plan.compiled_time import rates
    from jaxsmp.plan.hardware import GPUS
    from jaxsmp.plan.hlo_cost import estimate, kernel_kinds
    out, state, step, batch = measure_jaxsmp(row, deadline, ctx["target_s"],
                                             row["precision"], row["remat"])
    text = step.lower(state, batch).compile().as_text()
    work = estimate(text, rates(GPUS["H100-SXM"], row["precision"]))  # only its counts
    with tempfile.TemporaryDirectory() as trace:
        with jax.profiler.trace(trace):
            for _ in range(TRACED_STEPS):
                state, metrics = step(state, batch)
            jax.block_until_ready(metrics["loss"])
        seconds, unknown, longest = kernel_seconds(trace, kernel_kinds(text))
    per = {k: v / TRACED_STEPS for k, v in seconds.items()}
    other = sum(unknown.values()) / TRACED_STEPS
    top = sorted(unknown.items(), key=lambda kv: -kv[1])[:6]
    out.update(busy_s=sum(per.values()) + other, gemm_s=per.get("gemm", 0.0),
               attention_s=per.get("attention", 0.0), memory_s=per.get("memory", 0.0),
               copy_s=per.get("copy", 0.0), other_s=other,
               unknown=[(n[:80], s / TRACED_STEPS) for n, s in top],
               longest={k: {n: s / TRACED_STEPS for n, s in v.items()}
                        for k, v in longest.items()},
               gemm_flops=work.matmul_flops, attention_flops=work.attention_flops,
               memory_bytes=work.memory_bytes)
    # hlo_cost's memory-bound bytes include the in-place updates XLA runs as copies
    memory = per.get("memory", 0.0) + per.get("copy", 0.0)
    for key, amount, seconds_, scale in (
            ("gemm_tflops", work.matmul_flops, per.get("gemm"), 1e12),
            ("attention_tflops", work.attention_flops, per.get("attention"), 1e12),
            ("memory_gbps", work.memory_bytes, memory, 1e9)):
        out[key] = amount / seconds_ / scale if seconds_ else None
    return out
