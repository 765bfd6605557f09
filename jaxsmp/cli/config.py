"""Training-run configuration as a dataclass, and the command-line flags that fill it."""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class TrainConfig:
    model: str = "gpt_neox"
    preset: str = "tiny"
    dp: int = 1
    sdp: int | None = None
    tp: int = 1
    pp: int = 1
    simulate_devices: int = 8
    collectives: str = "auto"
    batch_size: int = 16
    seq_len: int = 128
    microbatches: int = 1
    pipeline: str = "simple"
    virtual_chunks: int = 2
    steps: int = 200
    lr: float = 3e-3
    warmup: int = 20
    weight_decay: float = 0.1
    clip_norm: float = 1.0
    precision: str = "fp32"
    remat: str = "none"
    attention: str = "auto"
    data: str | None = None
    eval_every: int = 50
    eval_batches: int = 2
    seed: int = 0
    progress: bool = True
    print_losses: bool = False
    checkpoint_dir: str | None = None
    save_every: int = 0
    keep: int = 3
    resume: str = "auto"
    async_checkpoint: bool = True
    init_from_hf: str | None = None


_HELP = {
    "model": "model family: gpt_neox, bloom, llama",
    "preset": "model size preset, e.g. tiny, 125m, 1.3b, 20b",
    "sdp": "sharded-data-parallel degree (default: the devices left over)",
    "simulate_devices": "number of simulated CPU devices (ignored on GPU/TPU)",
    "collectives": "algorithm for the sdp parameter gather / gradient reduce-scatter",
    "batch_size": "global batch size in sequences",
    "pipeline": "pipeline schedule when pp > 1: simple (GPipe), interleaved (1F1B), virtual",
    "virtual_chunks": "layer chunks per pipeline stage for --pipeline virtual",
    "microbatches": "gradient-accumulation steps per global batch (pipeline microbatches when pp > 1)",
    "precision": "fp32, bf16 or fp16 (dynamic loss scaling)",
    "remat": "activation checkpointing: none, full, save_matmuls, offload",
    "attention": "attention implementation: auto, blockwise, pallas, reference",
    "print_losses": "print every step's loss as JSON at the end (process 0)",
    "data": "text file or directory of *.txt (default: Python's bundled docs)",
    "checkpoint_dir": "directory for checkpoints (default: no checkpoints)",
    "save_every": "checkpoint every N steps (0: only at the end)",
    "keep": "how many of the latest checkpoints to keep",
    "resume": "auto (latest checkpoint if any), require (error if none), never",
    "async_checkpoint": "write checkpoints in the background while training continues",
    "init_from_hf": "fine-tune from a local Hugging Face checkpoint directory "
                    "(config.json + safetensors) of the --model family",
}


def parse_args(argv: list[str] | None = None, **defaults) -> TrainConfig:
    """Flags for every TrainConfig field (``--batch-size 32``); ``defaults`` override."""
    base = dataclasses.replace(TrainConfig(), **defaults)
    parser = argparse.ArgumentParser(description="Train a language model with jaxsmp.")
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        value = getattr(base, f.name)
        if f.type in ("bool", bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=value)
            continue
        kind = {"int": int, "float": float, "str": str}.get(str(f.type).split(" ")[0], str)
        parser.add_argument(flag, type=kind, default=value, help=_HELP.get(f.name))
    return TrainConfig(**vars(parser.parse_args(argv)))
