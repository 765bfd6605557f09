"""Derives :data:`jaxsmp.plan.calibration.MEMORY_SCALE` from compiled programs.

For a few shapes per family the step is compiled with XLA:GPU for 8 GPUs (deviceless,
:mod:`jaxsmp.plan.gpu_target`) at two depths; the roofline over each program
(:mod:`jaxsmp.plan.compiled_time`) gives its memory-bound seconds (kernels that are
neither GEMMs nor fused attention, launches included). Those are fitted by least
squares as ``layer x E + outside x O``, with ``E`` and ``O`` the analytic model's
unscaled layer traffic and head + optimizer traffic
(:func:`jaxsmp.plan.throughput.memory_bound`) of the same configurations.

    python -m jaxsmp.plan.calibrate [--family llama] [--gpu A100-80GB]

Prints the scales to paste into ``calibration.py``; takes a few minutes.
"""
from __future__ import annotations

import argparse
import os

import numpy as np

# family: (preset, overrides) of the shapes compiled; all with sdp=8, remat full
SHAPES = {
    "gpt_neox": [("1.3b", {}), ("6.9b", {})],
    "bloom": [("1b7", {}), ("7b1", {})],
    "llama": [("7b", {}), ("13b", {"num_key_value_heads": 8})],
}
DEPTHS = (4, 8)   # XLA unrolls the shortest scans, which changes the fusions
SEQ, BATCH, MICROBATCHES = 2048, 16, 2


def measurements(family: str, gpu: str) -> list[tuple[float, float, float]]:
    """(compiled memory-bound s, analytic layer s, analytic outside s) per compile."""
    import jaxsmp
    from jaxsmp.plan import cluster as make_cluster
    from jaxsmp.plan.candidate import Candidate
    from jaxsmp.plan.compiled import compile_candidate
    from jaxsmp.plan.compiled_time import compiled_time
    from jaxsmp.plan.gpu_preflight import _topology
    from jaxsmp.plan.throughput import memory_bound
    from jaxsmp.plan.workload import Workload
    target = make_cluster(f"8x{gpu}+400Gbps", 1)
    candidate = Candidate(1, 8, 1, 1, BATCH // 8 // MICROBATCHES, MICROBATCHES, "full")
    rows = []
    for name, overrides in SHAPES[family]:
        for depth in DEPTHS:
            field = "n_layer" if family == "bloom" else "num_hidden_layers"
            config = jaxsmp.models.preset(family, name, **overrides, **{field: depth})
            compiled = compile_candidate(config, candidate, SEQ, _topology(gpu, 8))
            kernels = compiled_time(compiled, target.node.gpu, "bf16", target).kernels
            layer, outside = memory_bound(Workload(config, SEQ), candidate, target)
            rows.append((kernels.memory + kernels.launch, layer, outside))
            print(f"  {family} {name} x{depth}: compiled {rows[-1][0]:.4f} s, analytic "
                  f"layers {layer:.4f} s + outside {outside:.4f} s", flush=True)
    return rows


def fit(rows: list[tuple[float, float, float]]) -> tuple[float, float]:
    """Least-squares (layer, outside) scales of the rows, relative errors weighed equally."""
    compiled = np.array([r[0] for r in rows])
    basis = np.array([[r[1], r[2]] for r in rows]) / compiled[:, None]
    (layer, outside), *_ = np.linalg.lstsq(basis, np.ones(len(rows)), rcond=None)
    if outside < 0:   # no negative time: the layers explain it all
        outside, layer = 0.0, float(np.linalg.lstsq(basis[:, :1], np.ones(len(rows)),
                                                    rcond=None)[0][0])
    return float(layer), float(outside)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m jaxsmp.plan.calibrate", description=__doc__)
    p.add_argument("--family", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--gpu", default="A100-80GB")
    args = p.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    for family in args.family:
        layer, outside = fit(measurements(family, args.gpu))
        print(f'    "{family}": MemoryScale({layer:.3f}, {outside:.3f}),', flush=True)


if __name__ == "__main__":
    main()
