"""``python -m jaxsmp.plan``: ranked training configurations for a model on a cluster.

    python -m jaxsmp.plan --model gpt_neox:13b --node p4d.24xlarge --nodes 16 \\
        --seq-len 2048 --global-batch 1024 [--precision bf16] [--top 10] [--json] [--preflight]

``--preflight`` compiles the best plan's step with XLA:GPU for the node's GPUs on this host
(``jaxsmp.plan.gpu_preflight``); ``--preflight-backend cpu`` on simulated CPU devices.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from jaxsmp import xla_flags
from jaxsmp.nn.remat import POLICIES
from jaxsmp.pipeline.schedule import SCHEDULES

SEMANTICS = ("target", "plain-gspmd")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jaxsmp.plan", description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True,
                   help="family:preset (gpt_neox:13b, bloom:176b, llama:70b) or a Hugging "
                        "Face config.json (or its directory)")
    p.add_argument("--node", required=True,
                   help="p4d.24xlarge, p4de.24xlarge, p5.48xlarge, p5e.48xlarge, or "
                        "generic '<gpus>x<gpu>+<gbps>Gbps' (e.g. 8xA100-80GB+400Gbps)")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--global-batch", type=int, required=True, help="sequences per step")
    p.add_argument("--precision", default="bf16", choices=("bf16", "fp8", "fp16", "fp32"),
                   help="fp8: float8 Linears on H100/H200 (refused on A100s)")
    p.add_argument("--reduce-dtype", default="auto", choices=("auto", "fp32", "bf16"),
                   help="dtype of the gradient reduce-scatter and dp all-reduce; auto: the "
                        "step's default (bf16 with --precision bf16, else fp32)")
    p.add_argument("--top", type=int, default=10)
    p.add_argument("--remat", nargs="+", default=list(POLICIES), choices=POLICIES,
                   help="remat policies to consider")
    p.add_argument("--schedules", nargs="+", default=list(SCHEDULES), choices=SCHEDULES)
    p.add_argument("--semantics", default="target", choices=SEMANTICS,
                   help="step semantics: jaxsmp's ZeRO-3 (target) or a plain GSPMD step")
    p.add_argument("--json", action="store_true", help="print the plans as a JSON list")
    p.add_argument("--preflight", action="store_true",
                   help="compile the best plan's step for the node's GPUs with XLA:GPU on "
                        "this host (deviceless; needs jax-cuda12-plugin, the cuda12 extra)")
    p.add_argument("--preflight-backend", choices=("gpu", "cpu"), default="gpu",
                   help="gpu: XLA:GPU for the plan's GPUs at full size (default); cpu: "
                        "simulated CPU devices, the mesh scaled to --max-devices")
    p.add_argument("--max-devices", type=int, default=None,
                   help="most simulated CPU devices for --preflight-backend cpu (default 64)")
    args = p.parse_args(argv)
    if args.top < 1:
        p.error(f"--top must be >= 1, got {args.top}")
    if args.max_devices is not None and not (args.preflight and args.preflight_backend == "cpu"):
        p.error("--max-devices applies to --preflight --preflight-backend cpu only")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    # simulated CPU devices must be set before JAX starts a backend (pre-flight only);
    # jax read JAX_PLATFORMS when jaxsmp imported it, so the setting goes to its config
    # too (else the CUDA plugin starts, fails without a GPU, and no GPU topology exists)
    if "JAX_PLATFORMS" not in os.environ:
        os.environ["JAX_PLATFORMS"] = "cpu"
        import jax
        jax.config.update("jax_platforms", "cpu")
    from jaxsmp.plan import PLAIN_GSPMD, TARGET, cluster, load_model, plan
    from jaxsmp.plan.report import records, table, why
    from jaxsmp.plan.workload import Workload
    try:
        config = load_model(args.model)
        if args.preflight and args.preflight_backend == "gpu":
            # compile the program a GPU runs under the trainer: jaxsmp's import adds its
            # overlap flags only where JAX_PLATFORMS allows a GPU, and sizes the combine
            # thresholds to 128 MiB where the trainer sizes them to the model's layer (a
            # no-op once JAX has started; the pre-flight then says the flags are missing)
            xla_flags.apply(Workload(config, args.seq_len).layer_bytes(args.precision),
                            gpu=True)
        target = cluster(args.node, args.nodes)
        plans = plan(config, target, seq_len=args.seq_len, global_batch=args.global_batch,
                     precision=args.precision, top=None, include_unfit=True,
                     semantics=TARGET if args.semantics == "target" else PLAIN_GSPMD,
                     remats=args.remat, schedules=args.schedules,
                     reduce_dtype=None if args.reduce_dtype == "auto" else args.reduce_dtype)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    shown = [p for p in plans if p.fits][:args.top] or plans[:args.top]
    if args.json:
        print(json.dumps(records(shown), indent=1))
    else:
        print(f"{args.model}: {plans[0].candidate.precision}, gradients reduced in "
              f"{plans[0].candidate.reduced}, seq {args.seq_len}, global batch "
              f"{args.global_batch} on {target}; step semantics: {args.semantics}; "
              f"{len(plans)} configurations, {sum(p.fits for p in plans)} fit")
        print(table(shown))
        print("\nWhy #1:\n" + why(plans))
    if args.preflight and shown[0].fits:
        try:
            result = _preflight(args, config, target, shown[0])
        except (ValueError, RuntimeError) as e:
            print(f"error: pre-flight: {e}", file=sys.stderr)
            return 2
        print(result.summary(), file=sys.stderr if args.json else sys.stdout)
    return 0


def _preflight(args: argparse.Namespace, config, target, best):
    from jaxsmp.plan import preflight
    from jaxsmp.plan.compiled import MAX_DEVICES
    from jaxsmp.plan.gpu_preflight import gpu_preflight
    from jaxsmp.plan.gpu_target import TARGETS
    if args.preflight_backend == "cpu":
        return preflight(config, best, args.seq_len, max_devices=args.max_devices or MAX_DEVICES)
    gpu = target.node.gpu.name
    if gpu not in TARGETS:
        raise ValueError(f"no GPU target for {gpu!r} (have {sorted(TARGETS)}); use "
                         f"--preflight-backend cpu")
    from jaxsmp.plan import PLAIN_GSPMD, TARGET
    return gpu_preflight(config, best, args.seq_len, gpu,
                         TARGET if args.semantics == "target" else PLAIN_GSPMD, target)


if __name__ == "__main__":
    sys.exit(main())
