"""The run's optimizer, mesh, model and initial state from its config."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from jaxsmp import hf
from jaxsmp.cli.config import ConfigError, TrainConfig
from jaxsmp.mesh import Mesh
from jaxsmp.models import preset
from jaxsmp.train.batch import check_batch
from jaxsmp.train.state import TrainState, init

VOCAB_MULTIPLE = 128  # a vocabulary grown to fit a tokenizer is padded to this multiple


def adamw(cfg: TrainConfig) -> optax.GradientTransformation:
    """AdamW with linear warm-up and cosine decay; the learning rate is reported."""
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, cfg.lr, max(cfg.warmup, 1), max(cfg.steps, cfg.warmup + 1), cfg.lr * 0.1)
    return optax.inject_hyperparams(optax.adamw)(
        learning_rate=schedule, b1=0.9, b2=0.95, weight_decay=cfg.weight_decay)


def model_vocab(cfg: TrainConfig, preset_vocab: int, data_vocab: int) -> int:
    """``--vocab-size`` if given (it must hold the data's tokens), else the preset's
    vocabulary, grown to the data's rounded up to a multiple of 128 if smaller."""
    if cfg.vocab_size is not None:
        if cfg.vocab_size < data_vocab:
            raise ConfigError(f"vocab_size={cfg.vocab_size} is smaller than the tokenizer's "
                             f"{data_vocab} tokens")
        return cfg.vocab_size
    if preset_vocab >= data_vocab:
        return preset_vocab
    return -(-data_vocab // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def run_mesh(cfg: TrainConfig) -> Mesh:
    """The run's mesh on this job's devices. Raises :class:`ConfigError` when the degrees
    do not fit the devices or the global batch does not split over the data axes and
    microbatches (the step's own check, :func:`jaxsmp.train.batch.check_batch`)."""
    try:
        mesh = Mesh(dp=cfg.dp, sdp=cfg.sdp, tp=cfg.tp, pp=cfg.pp, cp=cfg.cp, ep=cfg.ep,
                    collectives=cfg.collectives)
        tokens = jax.ShapeDtypeStruct((cfg.batch_size, cfg.seq_len), jnp.int32)
        check_batch({"tokens": tokens}, mesh, cfg.step.microbatches)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return mesh


def build(cfg: TrainConfig, data_vocab: int, mesh: Mesh) -> tuple[TrainState, object]:
    """The initial (sharded) state and the model config, for data of ``data_vocab`` tokens.
    A model the mesh cannot split, or a checkpoint that cannot be read, is a
    :class:`ConfigError` (raised before the step compiles)."""
    try:
        return _build(cfg, data_vocab, mesh)
    except (ValueError, OSError) as err:
        raise ConfigError(str(err)) from err


def _build(cfg: TrainConfig, data_vocab: int, mesh: Mesh) -> tuple[TrainState, object]:
    if cfg.init_from_hf:
        return from_hf(cfg, mesh, data_vocab)
    model_cfg = preset(cfg.model, cfg.preset, attention_impl=cfg.attention)
    vocab = model_vocab(cfg, model_cfg.vocab_size, data_vocab)
    if vocab != model_cfg.vocab_size:
        model_cfg = model_cfg.replace(vocab_size=vocab)
    if cfg.seq_len > getattr(model_cfg, "max_position_embeddings", cfg.seq_len):
        # rotary positions have no table: a model trained from scratch takes --seq-len
        model_cfg = model_cfg.replace(max_position_embeddings=cfg.seq_len)
    return init(model_cfg.build, adamw(cfg), mesh, seed=cfg.seed), model_cfg


def from_hf(cfg: TrainConfig, mesh: Mesh, data_vocab: int) -> tuple[TrainState, object]:
    """State and model config from the HF checkpoint ``cfg.init_from_hf``."""
    family, hf_cfg = hf.load_config(cfg.init_from_hf)
    if family != cfg.model:
        raise ConfigError(f"{cfg.init_from_hf} holds a {family} checkpoint but --model is "
                         f"{cfg.model}; pass --model {family}")
    if cfg.vocab_size is not None:
        raise ConfigError("vocab_size cannot be set with init_from_hf: the checkpoint fixes it")
    if cfg.seq_len > getattr(hf_cfg, "max_position_embeddings", cfg.seq_len):
        raise ConfigError(f"seq_len {cfg.seq_len} exceeds the checkpoint's "
                         f"max_position_embeddings={hf_cfg.max_position_embeddings}")
    if hf_cfg.vocab_size < data_vocab:
        raise ConfigError(f"the tokenizer has {data_vocab} tokens but the checkpoint "
                         f"{cfg.init_from_hf} only {hf_cfg.vocab_size}")
    return hf.init_from_hf(cfg.init_from_hf, adamw(cfg), mesh,
                           attention_impl=cfg.attention)
