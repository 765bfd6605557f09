"""Convert between Hugging Face checkpoints and jaxsmp parameters (GPT-NeoX, Bloom, Llama).

    # HF directory (config.json + safetensors) -> jaxsmp: orbax params + config.json
    python examples/convert_hf.py to-jaxsmp path/to/hf path/to/jaxsmp
    # jaxsmp -> HF directory that transformers.from_pretrained loads
    python examples/convert_hf.py to-hf path/to/jaxsmp path/to/hf_out --dtype bfloat16
    # HF -> jaxsmp -> HF
    python examples/convert_hf.py round-trip path/to/hf path/to/hf_out

Parameters go through the mesh shard by shard (orbax writes and reads each
device's shard), so no host holds the whole model. ``--sdp``/``--tp`` choose the mesh.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("direction", choices=["to-jaxsmp", "to-hf", "round-trip"])
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    p.add_argument("--sdp", type=int, default=None, help="default: all devices not in tp")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--dtype", default="float32", help="HF export dtype: float32, "
                   "bfloat16, float16")
    p.add_argument("--max-shard-size", type=int, default=5 * 2**30,
                   help="bytes per exported safetensors file")
    p.add_argument("--simulate-devices", type=int, default=8,
                   help="number of simulated CPU devices (ignored on GPU/TPU)")
    return p.parse_args(argv)


def to_jaxsmp(src: Path, dst: Path, mesh) -> None:
    """``dst/config.json`` (HF format) and ``dst/params`` (orbax, sharded)."""
    import orbax.checkpoint as ocp
    from flax import nnx

    from jaxsmp import hf
    config, _, params = hf.load_params(src, mesh)
    dst.mkdir(parents=True, exist_ok=True)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save((dst / "params").absolute(), nnx.to_pure_dict(params), force=True)
    (dst / "config.json").write_text(json.dumps(hf.to_hf_config(config), indent=2))


def load_jaxsmp(src: Path, mesh):
    """(config, params) restored from ``to_jaxsmp``'s output straight into their shards."""
    import jax
    import orbax.checkpoint as ocp
    from flax import nnx

    from jaxsmp import hf
    from jaxsmp.train.state import abstract_params, state_shardings
    _, config = hf.load_config(src)
    _, abstract = abstract_params(config.build, mesh)
    target = jax.tree.map(lambda v, s: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=s),
                          nnx.to_pure_dict(abstract),
                          nnx.to_pure_dict(state_shardings(abstract, mesh)))
    with ocp.StandardCheckpointer() as ckptr:
        restored = ckptr.restore((src / "params").absolute(), target)
    nnx.replace_by_pure_dict(abstract, restored)
    return config, abstract


def to_hf(src: Path, dst: Path, mesh, dtype: str, max_shard_size: int) -> None:
    from jaxsmp import hf
    config, params = load_jaxsmp(src, mesh)
    hf.save_checkpoint(params, config, dst, dtype=dtype, max_shard_size=max_shard_size)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from jaxsmp.simulated_devices import simulate_cpu_devices
    simulate_cpu_devices(args.simulate_devices)  # before JAX starts; ignored on GPU/TPU
    import jaxsmp
    from jaxsmp import hf
    mesh = jaxsmp.Mesh(sdp=args.sdp, tp=args.tp)
    if args.direction == "to-jaxsmp":
        to_jaxsmp(args.src, args.dst, mesh)
    elif args.direction == "to-hf":
        to_hf(args.src, args.dst, mesh, args.dtype, args.max_shard_size)
    else:
        config, _, params = hf.load_params(args.src, mesh)
        hf.save_checkpoint(params, config, args.dst, dtype=args.dtype,
                           max_shard_size=args.max_shard_size)
    print(f"{args.direction}: {args.src} -> {args.dst}")


if __name__ == "__main__":
    main(sys.argv[1:])
