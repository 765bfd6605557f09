"""Training-run configuration: one dataclass whose fields are the flags
(:mod:`jaxsmp.cli.flags`), the TOML keys grouped in sections
(:mod:`jaxsmp.cli.config_file`) and the saved resolved config."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from jaxsmp.cli.validate import ConfigError, check_config


def _f(default, section: str, help: str | None = None):
    return field(default=default, metadata={"section": section, "help": help})


@dataclass(frozen=True)
class TrainConfig:
    model: str = _f("gpt_neox", "model", "model family: gpt_neox, bloom, llama")
    preset: str = _f("tiny", "model", "model size preset, e.g. tiny, 125m, 1.3b, 20b")
    vocab_size: int | None = _f(None, "model", "model vocabulary (default: the preset's, "
                                "or the tokenizer's rounded up to a multiple of 128 if larger)")
    attention: str = _f("auto", "model", "attention implementation: auto, blockwise, pallas, "
                        "reference")
    init_from_hf: str | None = _f(None, "model", "fine-tune from a local Hugging Face "
                                  "checkpoint directory (config.json + safetensors; its "
                                  "tokenizer too unless --tokenizer is given)")
    dp: int = _f(1, "mesh", "data-parallel (replicated) degree")
    sdp: int | None = _f(None, "mesh", "sharded-data-parallel degree (default: the devices "
                         "left over)")
    tp: int = _f(1, "mesh", "tensor-parallel degree")
    pp: int = _f(1, "mesh", "pipeline-parallel degree")
    cp: int = _f(1, "mesh", "context-parallel degree: every sequence split over this many "
                 "devices (long sequences)")
    simulate_devices: int = _f(8, "mesh", "number of simulated CPU devices (ignored on GPU/TPU)")
    collectives: str = _f("auto", "mesh", "algorithm for the sdp parameter gather / gradient "
                          "reduce-scatter")
    steps: int = _f(200, "step", "number of training steps (the total, also when resuming)")
    batch_size: int = _f(16, "step", "global batch size in sequences")
    seq_len: int = _f(128, "step", "sequence length in tokens")
    microbatches: int = _f(1, "step", "gradient-accumulation steps per global batch (pipeline "
                           "microbatches when pp > 1)")
    pipeline: str = _f("simple", "step", "pipeline schedule when pp > 1: simple (GPipe), "
                       "interleaved (1F1B), virtual")
    virtual_chunks: int = _f(2, "step", "layer chunks per pipeline stage for --pipeline virtual")
    precision: str = _f("fp32", "step", "fp32, bf16 or fp16 (dynamic loss scaling)")
    remat: str = _f("none", "step", "activation checkpointing: none, full, save_matmuls, offload")
    sequence_parallel: bool = _f(False, "step", "Megatron sequence parallelism: activations "
                                 "between the tp matmuls split over tp on the sequence "
                                 "(needs --tp > 1)")
    context_parallel: str = _f("auto", "step", "how attention spans the cp devices: ulysses "
                               "(all-to-all over heads), ring, or auto (on GPUs ulysses where "
                               "the heads divide, else ring)")
    lr: float = _f(3e-3, "step", "peak learning rate (linear warm-up, cosine decay to 10%%)")
    warmup: int = _f(20, "step", "warm-up steps")
    weight_decay: float = _f(0.1, "step", "AdamW weight decay")
    clip_norm: float | None = _f(1.0, "step", "global gradient-norm clipping threshold "
                                 "(none: no clipping)")
    seed: int = _f(0, "step", "seed of the initial parameters and the data order")
    data: str | None = _f(None, "data", "a dataset prepared by jaxsmp.data.prepare, a text file "
                          "or a directory of *.txt (default: Python's bundled docs)")
    tokenizer: str | None = _f(None, "data", "tokenizer.json, an HF checkpoint directory, or "
                               "'bytes' (default: --init-from-hf's tokenizer, else bytes)")
    eval_every: int = _f(50, "data", "evaluate every N steps and at the end (0: never)")
    eval_batches: int = _f(2, "data", "held-out batches per evaluation")
    prefetch: int = _f(2, "data", "batches prepared ahead on a background thread (0: inline)")
    checkpoint_dir: str | None = _f(None, "checkpoint", "directory for checkpoints (default: "
                                    "no checkpoints)")
    save_every: int = _f(0, "checkpoint", "checkpoint every N steps (0: only at the end)")
    keep: int = _f(3, "checkpoint", "how many of the latest checkpoints to keep")
    resume: str = _f("auto", "checkpoint", "auto (latest checkpoint if any), require (error if "
                     "none), never")
    async_checkpoint: bool = _f(True, "checkpoint", "write checkpoints in the background while "
                                "training continues")
    log_dir: str | None = _f(None, "logging", "write metrics (JSON lines, TensorBoard), the "
                             "resolved config and profiles here")
    log_every: int = _f(10, "logging", "one plain log line every N steps when stdout is not a "
                        "terminal")
    progress: bool = _f(True, "logging", "progress bar on a terminal, log lines otherwise")
    print_losses: bool = _f(False, "logging", "print every step's loss as JSON at the end")
    profile_steps: str | None = _f(None, "logging", "START:STOP: trace the steps numbered "
                                   "START..STOP-1 (as logged, from 1) with jax.profiler into "
                                   "LOG_DIR/profile")
    log_all_processes: bool = _f(False, "logging", "every process prints (default: process 0)")

    def __post_init__(self) -> None:
        check_config(self)

    @property
    def profile_range(self) -> range | None:
        """The step numbers to trace (from 1, as logged): "5:8" -> steps 5, 6, 7."""
        if self.profile_steps is None:
            return None
        start, stop = self.profile_steps.split(":")
        return range(int(start), int(stop))


SECTIONS = ("model", "mesh", "step", "data", "checkpoint", "logging")
FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def section_of(name: str) -> str:
    return FIELDS[name].metadata["section"]


__all__ = ["ConfigError", "FIELDS", "SECTIONS", "TrainConfig", "section_of"]
