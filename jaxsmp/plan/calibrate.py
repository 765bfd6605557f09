"""Derives :data:`jaxsmp.plan.calibration.MEMORY_SCALE` from compiled programs.

For a few shapes per family the step is compiled with XLA:GPU for 8 GPUs (deviceless,
:mod:`jaxsmp.plan.gpu_target`) at two depths; the roofline over each program
(:mod:`jaxsmp.plan.compiled_time`) gives its memory-bound seconds (kernels that are
neither GEMMs nor fused attention, launches included). Those are fitted by
non-negative least squares (relative errors) as ``layer x A + weights x W + outside x
O``, with ``A``, ``W`` and ``O`` the analytic model's unscaled activation traffic,
weight traffic and head + optimizer traffic
(:func:`jaxsmp.plan.traffic.memory_bound`) of the same configurations. Per step,
activation traffic grows with tokens x width and weight traffic with microbatches x
width squared, so a family's shapes differ in width and, at one width, in microbatch
size (else the two are collinear).

    python -m jaxsmp.plan.calibrate [--family llama] [--gpu A100-80GB]

Every program is compiled with the overlap flags jaxsmp gives XLA on GPU hosts
(:mod:`jaxsmp.xla_flags`), the program a GPU runs: without them jaxsmp's own prefetch
copies each gathered weight into the layer loop's carry and the scales come out wrong
(Llama's weights 4.79 where the GPU's program gives 1.43).

``--held-out`` checks the scales instead on a shape per family they were not fitted on
(:data:`HELD_OUT`: 6 layers, 2 sequences of 4096 tokens a GPU): the analytic
memory-bound and compute seconds against the compiled program's.

``--fp8`` derives :data:`jaxsmp.plan.calibration.FP8_QUANTISE_BYTES` instead: each
:data:`FP8_SHAPES` shape compiled in bf16 and in fp8 for 8 H100s at the two depths, both
reducing gradients in float32 (fp8's default), the per-layer growth of fp8's
memory-bound seconds over bf16's against the analytic quantisation traffic
(:func:`jaxsmp.plan.traffic.fp8_quantise`).

Prints the scales to paste into ``calibration.py``; takes a few minutes.
"""
from __future__ import annotations

import argparse
import itertools
import os

import numpy as np

# family: (preset, overrides, microbatch size) of the shapes compiled, each with 16
# sequences of 2048 tokens on sdp=8, remat full
SHAPES = {
    "gpt_neox": [("1.3b", {}, 1, "full"), ("6.9b", {}, 1, "full"), ("6.9b", {}, 2, "full"),
                 ("1.3b", {}, 4, "none")],
    "bloom": [("1b7", {}, 1, "full"), ("7b1", {}, 1, "full"), ("7b1", {}, 2, "full"),
              ("1b7", {}, 4, "none")],
    "llama": [("7b", {}, 1, "full"), ("13b", {"num_key_value_heads": 8}, 1, "full"),
              ("13b", {"num_key_value_heads": 8}, 2, "full"), ("7b", {}, 4, "none")],
}
DEPTHS = (4, 8)   # XLA unrolls the shortest scans, which changes the fusions
SEQ, BATCH = 2048, 16
# Least scales: AdamW's 32 B per parameter and four passes over the logits are the
# least the optimizer and the loss can move (outside the layers and the activation and
# weight traffic both grow with depth, and an unbounded fit traded them off to 0)
FLOOR = (0.0, 0.0, 1.0)
# (family, preset, microbatch size) of the fp8 shapes: two widths, and at one of them
# two microbatch sizes (weights and activations are both quantised)
FP8_SHAPES = [("gpt_neox", "1.3b", 1), ("gpt_neox", "1.3b", 4), ("llama", "7b", 1)]


# family: (preset, layers) of the held-out shapes, at HELD_OUT_SEQ tokens, remat full,
# 2 microbatches of one sequence a GPU on sdp=8
HELD_OUT = {"llama": ("7b", 6), "gpt_neox": ("2.7b", 6), "bloom": ("7b1", 6)}
HELD_OUT_SEQ = 4096


def _require_gpu_flags(candidate) -> None:
    from jaxsmp import xla_flags
    if candidate.world > 1 and not xla_flags.overlap_flags_set():
        raise RuntimeError(f"{candidate.label()} would compile without jaxsmp's GPU overlap "
                           f"flags (jaxsmp.xla_flags), a program no GPU runs: set them "
                           f"before JAX's backend starts (xla_flags.apply(gpu=True)), or run "
                           f"python -m jaxsmp.plan.calibrate")


def compiled_kernels(config, candidate, gpu: str, depth: int, seq: int = 0):
    """The roofline (:class:`jaxsmp.plan.hlo_cost.KernelTime`) of one step of
    ``candidate`` with ``depth`` layers of ``config`` on ``seq`` tokens (default
    :data:`SEQ`), compiled for ``gpu`` deviceless; on more than one GPU with jaxsmp's
    overlap flags (the program a GPU runs)."""
    _require_gpu_flags(candidate)
    from jaxsmp.plan import Cluster, generic_node
    from jaxsmp.plan.compiled import compile_candidate, layer_field
    from jaxsmp.plan.compiled_time import compiled_time
    from jaxsmp.plan.gpu_preflight import _topology
    target = Cluster(generic_node(gpu, gpus=candidate.world), 1)
    config = config.replace(**{layer_field(config): depth})
    compiled = compile_candidate(config, candidate, seq or SEQ, _topology(gpu, candidate.world))
    return compiled_time(compiled, target.node.gpu, candidate.precision, target).kernels


def compiled_memory(config, candidate, gpu: str, depth: int) -> float:
    """Memory-bound seconds (launches included) of :func:`compiled_kernels`."""
    kernels = compiled_kernels(config, candidate, gpu, depth)
    return kernels.memory + kernels.launch


def measurements(family: str, gpu: str) -> list[tuple[float, ...]]:
    """(compiled memory-bound s, analytic activation, weight, outside s) per compile."""
    import jaxsmp
    from jaxsmp.plan import cluster as make_cluster
    from jaxsmp.plan.candidate import Candidate
    from jaxsmp.plan.compiled import layer_field
    from jaxsmp.plan.traffic import memory_bound, stash_seconds
    from jaxsmp.plan.workload import Workload
    target = make_cluster(f"8x{gpu}+400Gbps", 1)
    rows = []
    for name, overrides, mbs, remat in SHAPES[family]:
        candidate = Candidate(1, 8, 1, 1, mbs, max(1, BATCH // 8 // mbs), remat)
        for depth in DEPTHS:
            config = jaxsmp.models.preset(family, name, **overrides)
            seconds = compiled_memory(config, candidate, gpu, depth)
            config = config.replace(**{layer_field(config): depth})
            w = Workload(config, SEQ)
            parts = memory_bound(w, candidate, target)
            rows.append((seconds - stash_seconds(w, candidate, target), *parts))
            print(f"  {family} {name} x{depth} mbs {mbs}: compiled {rows[-1][0]:.4f} s; "
                  f"analytic activations {parts[0]:.4f} s, weights {parts[1]:.4f} s, "
                  f"outside {parts[2]:.4f} s", flush=True)
    return rows


def fp8_measurements(gpu: str = "H100-SXM") -> list[tuple[float, float]]:
    """(compiled, analytic unscaled) seconds per layer that fp8 adds, per shape."""
    import jaxsmp
    from jaxsmp.plan import cluster as make_cluster
    from jaxsmp.plan.candidate import Candidate
    from jaxsmp.plan.compiled import layer_field
    from jaxsmp.plan.traffic import fp8_quantise
    from jaxsmp.plan.workload import Workload
    target = make_cluster(f"8x{gpu}+400Gbps", 1)
    rows = []
    for family, name, mbs in FP8_SHAPES:
        extra = {}
        for depth in DEPTHS:
            config = jaxsmp.models.preset(family, name)
            # both reduce in float32, fp8's default: the difference is fp8's own
            seconds = {p: compiled_memory(config, Candidate(1, 8, 1, 1, mbs, 1, "none", p,
                                                            reduce_dtype="fp32"), gpu, depth)
                       for p in ("bf16", "fp8")}
            fp8 = Candidate(1, 8, 1, 1, mbs, 1, "none", "fp8")
            config = config.replace(**{layer_field(config): depth})
            analytic = fp8_quantise(Workload(config, SEQ), fp8, target)
            extra[depth] = (seconds["fp8"] - seconds["bf16"], analytic)
        layers = DEPTHS[1] - DEPTHS[0]
        rows.append(tuple((extra[DEPTHS[1]][i] - extra[DEPTHS[0]][i]) / layers
                          for i in range(2)))
        print(f"  {family} {name} mbs {mbs}: fp8 adds {rows[-1][0] * 1e3:.3f} ms a layer "
              f"compiled, {rows[-1][1] * 1e3:.3f} ms at 1 byte an element", flush=True)
    return rows


def held_out(family: str, gpu: str = "A100-80GB") -> tuple[tuple[float, float], ...]:
    """((analytic, compiled) memory-bound seconds, the residual copies included in both;
    (analytic, compiled) compute seconds) of the family's :data:`HELD_OUT` shape."""
    import jaxsmp
    from jaxsmp.plan import Cluster, estimate_time, generic_node
    from jaxsmp.plan.candidate import Candidate
    from jaxsmp.plan.compiled import layer_field
    from jaxsmp.plan.traffic import memory_bound, stash_seconds
    from jaxsmp.plan.workload import Workload
    name, depth = HELD_OUT[family]
    candidate = Candidate(1, 8, 1, 1, 1, 2, "full")
    config = jaxsmp.models.preset(family, name)
    kernels = compiled_kernels(config, candidate, gpu, depth, HELD_OUT_SEQ)
    w = Workload(config.replace(**{layer_field(config): depth}), HELD_OUT_SEQ)
    target = Cluster(generic_node(gpu, gpus=8), 1)
    scale, parts = w.memory_scale, memory_bound(w, candidate, target)
    analytic = (scale.layer * parts[0] + scale.weights * parts[1] + scale.outside * parts[2]
                + stash_seconds(w, candidate, target))
    step = estimate_time(w, candidate, target)
    return ((analytic, kernels.memory + kernels.launch),
            (step.compute + step.optimizer, kernels.compute))


def fit(rows: list[tuple[float, ...]]) -> tuple[float, ...]:
    """Least-squares scales of the rows' analytic parts, each at least its
    :data:`FLOOR`, relative errors weighed equally (every subset of the parts tried above
    its floor; the best feasible one kept)."""
    compiled = np.array([r[0] for r in rows])
    basis = np.array([r[1:] for r in rows]) / compiled[:, None]
    target = 1 - basis @ np.array(FLOOR)
    best, best_residual = np.zeros(basis.shape[1]), float("inf")
    for subset in itertools.product((False, True), repeat=basis.shape[1]):
        columns = [i for i, used in enumerate(subset) if used]
        if not columns:
            continue
        scales, *_ = np.linalg.lstsq(basis[:, columns], target, rcond=None)
        residual = float(np.sum((basis[:, columns] @ scales - target) ** 2))
        if (scales >= 0).all() and residual < best_residual:
            best, best_residual = np.zeros(basis.shape[1]), residual
            best[columns] = scales
    return tuple(float(s + f) for s, f in zip(best, FLOOR))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m jaxsmp.plan.calibrate", description=__doc__)
    p.add_argument("--family", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--gpu", default="A100-80GB")
    p.add_argument("--fp8", action="store_true",
                   help="derive FP8_QUANTISE_BYTES (on H100-SXM) instead of the scales")
    p.add_argument("--held-out", action="store_true",
                   help="check the recorded scales on HELD_OUT's shapes instead")
    args = p.parse_args(argv)
    from jaxsmp import xla_flags
    xla_flags.apply(gpu=True)   # before JAX starts: the program a GPU runs
    if "JAX_PLATFORMS" not in os.environ:
        # python -m imported jaxsmp, and with it jax, before this line: tell its config too
        # (else the CUDA plugin starts, fails without a GPU, and no GPU topology exists)
        os.environ["JAX_PLATFORMS"] = "cpu"
        import jax
        jax.config.update("jax_platforms", "cpu")
    if args.held_out:
        for family in args.family:
            (memory, compiled_memory_s), (compute, compiled_compute) = held_out(family, args.gpu)
            name, depth = HELD_OUT[family]
            print(f"  held out {family} {name} x{depth} s{HELD_OUT_SEQ} on {args.gpu}: "
                  f"memory-bound analytic {memory:.4f} s, compiled {compiled_memory_s:.4f} s "
                  f"({memory / compiled_memory_s - 1:+.1%}); compute analytic {compute:.4f} s, "
                  f"compiled {compiled_compute:.4f} s ({compute / compiled_compute - 1:+.1%})",
                  flush=True)
        return
    if args.fp8:
        rows = fp8_measurements()
        ratios = [compiled / analytic for compiled, analytic in rows]
        print(f"FP8_QUANTISE_BYTES = {sum(ratios) / len(ratios):.2f}  # per shape: "
              + ", ".join(f"{r:.2f}" for r in ratios), flush=True)
        return
    for family in args.family:
        scales = fit(measurements(family, args.gpu))
        print(f'    "{family}": MemoryScale({", ".join(f"{s:.3f}" for s in scales)}),',
              flush=True)


if __name__ == "__main__":
    main()
