"""Pallas FlashAttention launch sweep on one GPU: each kernel (forward, dq, dkv) timed alone
over blocks, warps and pipeline stages, causal, bf16; the best with the causal mask applied
to every tile (before 2026-11-27) and to the diagonal tiles only; then forward + backward
end to end against cuDNN and JAX's own Pallas attention (``jax.experimental.pallas.ops.gpu``).

    python bench/pallas_sweep.py --out "$OUT" --budget 240     # on the GPU machine
    python bench/pallas_sweep.py --seq 32768 --dims 64 ...     # another shape
    python bench/pallas_sweep.py --smoke                        # CPU, interpret mode

Kernels are lowered one by one (the launch settings are patched in) and compiled in
threads; each is timed as calls launched back to back (median of 3 runs). TFLOP/s count
the causal half of each kernel's matmuls: 2 (forward), 3 (dq), 4 (dkv) of b·h·s²·d each.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

GPU = {"seq": 8192, "tokens": 32768, "width": 2048, "dims": (64, 128), "interpret": False,
       "blocks": ((64, 64), (128, 64), (64, 128), (128, 128), (128, 32), (32, 128),
                  (64, 32), (32, 64)), "warps": (4, 8), "stages": (1, 2, 3)}
SMOKE = {"seq": 64, "tokens": 64, "width": 64, "dims": (16, 32), "interpret": True,
         "blocks": ((16, 16), (32, 16)), "warps": (4,), "stages": (2,)}
MATMULS = {"forward": 2, "dq": 3, "dkv": 4}
TOP = 3   # configurations per kernel and head dim timed again with the mask on every tile


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--budget", type=float, default=240.0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--seq", type=int, default=None,
                        help=f"sequence length (default {GPU['seq']}; 32,768 tokens a call)")
    parser.add_argument("--dims", type=int, nargs="+", default=None,
                        help=f"head dims (default {' '.join(map(str, GPU['dims']))})")
    return parser.parse_args(argv)


@contextlib.contextmanager
def mask_every_tile(every_tile: bool):
    """With ``every_tile``, the kernels' causal split patched off while one is lowered."""
    import jax.numpy as jnp

    from pallas_kernels import flash_backward, flash_forward
    saved = (flash_forward.unmasked_key_blocks, flash_backward.unmasked_key_blocks,
             flash_backward.first_unmasked_query_block)
    if every_tile:
        flash_forward.unmasked_key_blocks = lambda q_start, **_: jnp.int32(0)
        flash_backward.unmasked_key_blocks = lambda q_start, **_: jnp.int32(0)
        flash_backward.first_unmasked_query_block = (
            lambda k_start, *, num_q_blocks, **_: jnp.int32(num_q_blocks))
    try:
        yield
    finally:
        (flash_forward.unmasked_key_blocks, flash_backward.unmasked_key_blocks,
         flash_backward.first_unmasked_query_block) = saved


def inputs(dim: int, shape: dict):
    import jax
    import jax.numpy as jnp

    from pallas_kernels.flash_forward import flash_forward
    from pallas_kernels.flash_tuning import Launch
    batch, heads = max(1, shape["tokens"] // shape["seq"]), shape["width"] // dim
    keys = jax.random.split(jax.random.key(dim), 4)
    q, k, v, do = (jax.random.normal(key, (batch, shape["seq"], heads, dim), jnp.bfloat16)
                   for key in keys)
    out, lse = jax.jit(lambda q, k, v: flash_forward(
        q, k, v, None, None, scale=dim ** -0.5, causal=True,
        launch=Launch(*shape["blocks"][0], 4, 2), interpret=shape["interpret"]))(q, k, v)
    delta = jnp.einsum("bshd,bshd->bhs", out.astype(jnp.float32), do.astype(jnp.float32))
    return {"forward": (q, k, v), "dq": (q, k, v, do, lse, delta),
            "dkv": (q, k, v, do, lse, delta)}, batch * heads * shape["seq"] ** 2 * dim


def lower(kernel: str, dim: int, config: dict, args, smoke: bool):
    import jax

    from pallas_kernels.flash_backward import flash_dkv, flash_dq
    from pallas_kernels.flash_forward import flash_forward
    from pallas_kernels.flash_tuning import Launch
    fn = {"forward": flash_forward, "dq": flash_dq, "dkv": flash_dkv}[kernel]
    setting = Launch(config["block_q"], config["block_k"], config["warps"], config["stages"])
    kw = dict(scale=dim ** -0.5, causal=True, launch=setting, interpret=smoke)
    nones = (None, None)
    with mask_every_tile(config["every_tile"]):
        return jax.jit(lambda *a: fn(*a, *nones, **kw)).lower(*args)


def time_calls(compiled, args, deadline: float) -> float:
    import jax
    jax.block_until_ready(compiled(*args))
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    one = time.perf_counter() - start
    n = int(max(1, min(30, 0.05 / max(one, 1e-6))))
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        out = None
        for _ in range(n):
            out = compiled(*args)
        jax.block_until_ready(out)
        runs.append((time.perf_counter() - start) / n)
        if time.time() > deadline:
            break
    return statistics.median(runs)


def measure(configs: list[dict], shape: dict, smoke: bool, deadline: float, log) -> None:
    """Lowers, compiles (threads) and times each config in place: ``ms``, ``tflops`` or
    ``error``."""
    cache = {}
    for dim in sorted({c["dim"] for c in configs}):
        cache[dim] = inputs(dim, shape)
    lowered = []
    for c in configs:
        if time.time() > deadline:
            c["error"] = "budget spent before lowering"
            continue
        try:
            lowered.append((c, lower(c["kernel"], c["dim"], c, cache[c["dim"]][0][c["kernel"]],
                                     smoke)))
        except Exception as e:  # recorded
            c["error"] = f"lower: {type(e).__name__}: {str(e).splitlines()[0][:200]}"

    def compile_one(item):
        c, low = item
        try:
            return c, low.compile()
        except Exception as e:
            c["error"] = f"compile: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            return c, None
    with ThreadPoolExecutor(max(1, min(16, os.cpu_count() or 1))) as pool:
        compiled = list(pool.map(compile_one, lowered))
    for c, exe in compiled:
        if exe is None:
            continue
        if time.time() > deadline:
            c["error"] = "budget spent before timing"
            continue
        args, unit = cache[c["dim"]]
        try:
            seconds = time_calls(exe, args[c["kernel"]], deadline)
        except Exception as e:
            c["error"] = f"run: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            continue
        c["ms"] = seconds * 1e3
        c["tflops"] = MATMULS[c["kernel"]] * unit / seconds / 1e12
        print(f"{c['kernel']:7} d={c['dim']:3} {c['block_q']:3}x{c['block_k']:<3} "
              f"w{c['warps']} s{c['stages']} {'every' if c['every_tile'] else 'diag '} "
              f"{c['ms']:8.3f} ms {c['tflops']:6.1f} TFLOP/s", file=log, flush=True)


def sweep_configs(shape: dict) -> list[dict]:
    return [{"kernel": kernel, "dim": dim, "block_q": bq, "block_k": bk, "warps": w,
             "stages": s, "every_tile": False}
            for kernel, dim, (bq, bk), w, s in itertools.product(
                MATMULS, shape["dims"], shape["blocks"], shape["warps"], shape["stages"])]


def best(configs: list[dict], top: int) -> list[dict]:
    out = []
    for kernel, dim in itertools.product(MATMULS, sorted({c["dim"] for c in configs})):
        ok = sorted((c for c in configs if c["kernel"] == kernel and c["dim"] == dim
                     and "ms" in c and not c["every_tile"]), key=lambda c: c["ms"])
        out += ok[:top]
    return out


def end_to_end(shape: dict, smoke: bool, deadline: float, log) -> list[dict]:
    """Forward + backward through ``attention`` (Pallas at its defaults, cuDNN) and
    JAX's own Pallas ``mha`` at its defaults; TFLOP/s as bench/gpucheck/attention.py."""
    import jax
    import jax.numpy as jnp

    from pallas_kernels.attention import attention
    rows = []
    for dim in shape["dims"]:
        batch, heads = max(1, shape["tokens"] // shape["seq"]), shape["width"] // dim
        keys = jax.random.split(jax.random.key(0), 4)
        q, k, v, do = (jax.random.normal(key, (batch, shape["seq"], heads, dim), jnp.bfloat16)
                       for key in keys)
        for name in ("pallas", "cudnn", "jax mha"):
            row = {"impl": name, "dim": dim}
            rows.append(row)
            if time.time() > deadline or (smoke and name != "pallas"):
                row["error"] = "budget spent" if not smoke else "GPU only"
                continue
            try:
                fn = _mha(dim) if name == "jax mha" else (
                    lambda q, k, v, name=name: attention(q, k, v, causal=True, impl=name))

                @jax.jit
                def fwd_bwd(q, k, v, fn=fn):
                    out, vjp = jax.vjp(fn, q, k, v)
                    return out, vjp(do)
                seconds = time_calls(fwd_bwd, (q, k, v), deadline)
            except Exception as e:  # recorded
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                continue
            flops = 3.5 * 4 * batch * heads * shape["seq"] ** 2 * dim / 2
            row.update(ms=seconds * 1e3, tflops=flops / seconds / 1e12)
            print(f"end to end {name:8} d={dim:3} {row['ms']:8.3f} ms "
                  f"{row['tflops']:6.1f} TFLOP/s", file=log, flush=True)
    return rows


def _mha(dim: int):
    from jax.experimental.pallas.ops.gpu.attention import mha
    return lambda q, k, v: mha(q, k, v, None, sm_scale=dim ** -0.5, causal=True)


def table(rows: list[dict], keys: list[str]) -> list[str]:
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        cells = [r.get(key, "") for key in keys]
        lines.append("| " + " | ".join(f"{c:.3f}" if isinstance(c, float) else str(c)
                                         for c in cells) + " |")
    return lines


def write(out: Path | None, results: dict) -> None:
    import jax
    results["device"] = jax.devices()[0].device_kind
    results["jax"] = jax.__version__
    text = [f"# Pallas attention sweep: {results['device']}, jax {results['jax']}", ""]
    keys = ["kernel", "dim", "block_q", "block_k", "warps", "stages", "every_tile", "ms",
            "tflops", "error"]
    text += ["## Best per kernel, and the mask on every tile", ""]
    text += table(results.get("compare", []), keys)
    text += ["", "## End to end, forward + backward", ""]
    text += table(results.get("end_to_end", []), ["impl", "dim", "ms", "tflops", "error"])
    text += ["", "## Every configuration", ""] + table(results.get("sweep", []), keys)
    for folder in filter(None, [out]):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "pallas_sweep.json").write_text(json.dumps(results, indent=1))
        (folder / "pallas_sweep.md").write_text("\n".join(text) + "\n")


def default_configs(shape: dict) -> list[dict]:
    """The launch settings before this sweep: 64 x 64 blocks, 4 warps up to head dim 64
    else 8, 2 stages, for each kernel, with the mask on every tile."""
    bq, bk = shape["blocks"][0]
    return [{"kernel": kernel, "dim": dim, "block_q": bq, "block_k": bk,
             "warps": 4 if dim <= 64 or len(shape["warps"]) == 1 else 8, "stages": 2,
             "every_tile": True} for kernel in MATMULS for dim in shape["dims"]]


def main(argv=None) -> int:
    args = parse(argv)
    if args.smoke:
        os.environ["JAX_PLATFORMS"] = "cpu"
    shape = dict(SMOKE if args.smoke else GPU)
    shape.update({k: v for k, v in (("seq", args.seq), ("dims", args.dims)) if v})
    start, results = time.time(), {"budget_s": args.budget}
    end = start + args.budget
    log = sys.stderr
    configs = sweep_configs(shape)
    measure(configs, shape, args.smoke, start + 0.55 * args.budget, log)
    results["sweep"] = configs
    write(args.out, results)
    again = [dict(c, every_tile=True) for c in best(configs, TOP)] + default_configs(shape)
    measure(again, shape, args.smoke, start + 0.75 * args.budget, log)
    results["compare"] = sorted(best(configs, TOP) + again, key=lambda c: (
        c["kernel"], c["dim"], c["block_q"], c["block_k"], c["warps"], c["stages"]))
    write(args.out, results)
    results["end_to_end"] = end_to_end(shape, args.smoke, end, log)
    results["wall_s"] = round(time.time() - start, 1)
    write(args.out, results)
    print("\n".join(table(results["end_to_end"], ["impl", "dim", "ms", "tflops", "error"])))
    return 0


if __name__ == "__main__":
    root = Path(__file__).resolve().parents[1]
    sys.path[:] = [str(root)] + [p for p in sys.path
                                 if Path(p or ".").resolve() != root / "bench"]
    sys.exit(main())
