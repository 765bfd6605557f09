"""Training-run configuration: :class:`TrainConfig`, whose settings are the flags
(:mod:`jaxsmp.cli.flags`), the TOML keys grouped in sections
(:mod:`jaxsmp.cli.config_file`) and the saved resolved config. The ``[step]`` settings
are the fields of the step's own :class:`~jaxsmp.train.options.StepOptions`."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from jaxsmp.cli.validate import ConfigError, check_config, field_kinds
from jaxsmp.train.options import StepOptions


def _f(default, section: str, help: str | None = None):
    return field(default=default, metadata={"section": section, "help": help})


@dataclass(frozen=True)
class TrainConfig:
    model: str = _f("gpt_neox", "model", "model family: gpt_neox, bloom, llama, mixtral")
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
    ep: int = _f(1, "mesh", "expert-parallel degree: a mixture of experts' experts split over "
                 "this many data devices, tokens sent to them by all-to-all (must divide "
                 "the expert count)")
    simulate_devices: int = _f(8, "mesh", "number of simulated CPU devices (ignored on GPU/TPU)")
    collectives: str = _f("auto", "mesh", "algorithm for the sdp parameter gather / gradient "
                          "reduce-scatter")
    step: StepOptions = field(default_factory=StepOptions, metadata={"section": "step"})
    steps: int = _f(200, "train", "number of training steps (the total, also when resuming)")
    batch_size: int = _f(16, "train", "global batch size in sequences")
    seq_len: int = _f(128, "train", "sequence length in tokens")
    lr: float = _f(3e-3, "train", "peak learning rate (linear warm-up, cosine decay to 10%%)")
    warmup: int = _f(20, "train", "warm-up steps")
    weight_decay: float = _f(0.1, "train", "AdamW weight decay")
    seed: int = _f(0, "train", "seed of the initial parameters and the data order")
    data: str | None = _f(None, "data", "a dataset prepared by jaxsmp.data.prepare, a text file "
                          "or a directory of *.txt (default: Python's bundled docs)")
    tokenizer: str | None = _f(None, "data", "tokenizer.json, an HF checkpoint directory, or "
                               "'bytes' (default: --init-from-hf's tokenizer, else bytes)")
    eval_every: int = _f(50, "data", "evaluate every N steps and at the end (0: never)")
    eval_batches: int = _f(2, "data", "held-out batches per evaluation")
    read_ahead: int = _f(2, "data", "batches read and put on the devices ahead, on a "
                         "background thread (0: inline)")
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
        if not isinstance(self.step, StepOptions):
            raise ConfigError(f"step must be a jaxsmp StepOptions, got {self.step!r}")
        check_config(self, flat(self), SETTINGS)

    @property
    def profile_range(self) -> range | None:
        """The step numbers to trace (from 1, as logged): "5:8" -> steps 5, 6, 7."""
        if self.profile_steps is None:
            return None
        start, stop = self.profile_steps.split(":")
        return range(int(start), int(stop))


# The StepOptions fields the trainer sets, with their help (a name StepOptions lacks in
# this tree is skipped). ``collectives`` is set on the mesh (``--collectives``); a new step
# option needs a line here or in NOT_FLAGS.
STEP_HELP = {
    "microbatches": "gradient-accumulation steps per global batch (pipeline microbatches "
                    "when pp > 1)",
    "precision": "fp32, bf16, fp16 (dynamic loss scaling) or fp8 where available",
    "fp8_history": "steps of amax history that scale fp8 matmuls (precision fp8 only)",
    "fp8_vocab": "run the vocabulary projection in fp8 too (precision fp8 only)",
    "remat": "activation checkpointing: none, full, save_qkv, save_matmuls, offload",
    "clip_norm": "global gradient-norm clipping threshold (none: no clipping)",
    "bucket": "gather each layer's parameters as one flat buffer, one collective per layer",
    "prefetch": "gather layer i+1 while layer i computes: on, off, or auto (on GPUs)",
    "sequence_parallel": "Megatron sequence parallelism: activations between the tp matmuls "
                         "split over tp on the sequence (needs --tp > 1)",
    "pipeline": "pipeline schedule when pp > 1: simple (GPipe), interleaved (1F1B), virtual",
    "virtual_chunks": "layer chunks per pipeline stage for --pipeline virtual",
    "pipeline_partition": "layers per pipeline stage: auto (balanced on compiled costs), "
                          "equal, or one count per stage, e.g. 6,10",
    "pipeline_head": "where 1F1B runs the vocabulary projection and loss: last (the last "
                     "stage), spread (every stage on 1/pp of each microbatch) or auto",
    "context_parallel": "how attention spans the cp devices: ulysses (all-to-all over heads), "
                        "ring, or auto (on GPUs ulysses where the heads divide, else ring)",
    "activation_gather": "MLP and vocabulary GEMMs keep weights split over sdp and gather "
                         "the batch: auto (where that moves fewer bytes), always, never",
    "reduce_dtype": "dtype of the gradient reduce-scatter / all-reduce: fp32, bf16 (half the "
                    "bytes; accumulation stays fp32) or auto (bf16 with --precision bf16)",
}
NOT_FLAGS = ("collectives",)
NONE_WORD = {"prefetch": "auto", "reduce_dtype": "auto"}  # how None is spelled where "none" would mislead


@dataclass(frozen=True)
class Setting:
    """One flag / config-file key."""
    name: str
    section: str
    help: str
    default: Any
    kinds: tuple[type, ...]

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def none_word(self) -> str:
        return NONE_WORD.get(self.name, "none")


def _settings() -> dict[str, Setting]:
    step = {f.name: f for f in dataclasses.fields(StepOptions)}
    out = {}
    for f in dataclasses.fields(TrainConfig):
        if f.name == "step":
            out.update({n: Setting(n, "step", h, step[n].default, field_kinds(step[n]))
                        for n, h in STEP_HELP.items() if n in step})
        else:
            out[f.name] = Setting(f.name, f.metadata["section"], f.metadata["help"],
                                  f.default, field_kinds(f))
    return out


SECTIONS = ("model", "mesh", "step", "train", "data", "checkpoint", "logging")
SETTINGS = _settings()


def section_of(name: str) -> str:
    return SETTINGS[name].section


def flat(cfg: TrainConfig) -> dict[str, Any]:
    """Every setting of ``cfg`` by name, the step options' among them."""
    return {n: getattr(cfg.step if s.section == "step" else cfg, n) for n, s in SETTINGS.items()}


def make_config(values: dict[str, Any]) -> TrainConfig:
    """A TrainConfig from settings by name (flags, config file): the ``[step]`` ones
    become its StepOptions. Raises :class:`ConfigError` naming a bad value."""
    step = {n: v for n, v in values.items() if section_of(n) == "step"}
    rest = {n: v for n, v in values.items() if section_of(n) != "step"}
    check_config(None, step, SETTINGS)  # the trainer's wording, before StepOptions' own
    try:
        options = StepOptions(**step)
    except (TypeError, ValueError) as err:
        raise ConfigError(str(err)) from None
    return TrainConfig(**rest, step=options)


__all__ = ["ConfigError", "SECTIONS", "SETTINGS", "Setting", "TrainConfig", "flat",
           "make_config", "section_of"]
