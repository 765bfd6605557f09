"""Train GPT-NeoX with jaxsmp.

Default: the tiny preset on 8 simulated CPU devices (sdp=8), byte-level tokens
of the Python documentation bundled with every CPython. On a GPU cluster:

    python examples/train_gpt_neox.py --preset 20b --sdp 64 --tp 2 \
        --precision bf16 --remat full --microbatches 4 --batch-size 256 --seq-len 2048
"""
import sys

from jaxsmp.trainer.config import parse_args


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv, model="gpt_neox")
    from jaxsmp.simulated_devices import simulate_cpu_devices
    simulate_cpu_devices(cfg.simulate_devices)  # before JAX starts; ignored on GPU/TPU
    from jaxsmp.trainer import run
    history = run(cfg)
    print(f"loss: first {history.losses[0]:.3f} -> last {history.losses[-1]:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
