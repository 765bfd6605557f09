"""Train a preset on text with a progress bar (loss, tokens/s, TFLOP/s per device, MFU)."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import jax
import numpy as np
import optax
from tqdm import tqdm

from jaxsmp import hf, losses
from jaxsmp.checkpoint import CheckpointManager, describe_model
from jaxsmp.data import ByteTokenizer, TokenBatches, load_corpus
from jaxsmp.mesh import Mesh
from jaxsmp.metrics import peak_flops_per_device, train_flops_per_token
from jaxsmp.models import preset
from jaxsmp.train.batch import to_host
from jaxsmp.train.state import TrainState, init
from jaxsmp.train.step import eval_step, step
from jaxsmp.cli.config import TrainConfig


@dataclass
class History:
    losses: list[float] = field(default_factory=list)
    eval_losses: dict[int, float] = field(default_factory=dict)
    tokens_per_second: list[float] = field(default_factory=list)
    start_step: int = 0  # > 0 when resumed from a checkpoint; losses[k] is step start_step+k


def adamw(cfg: TrainConfig) -> optax.GradientTransformation:
    """AdamW with linear warm-up and cosine decay; the learning rate is reported."""
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, cfg.lr, max(cfg.warmup, 1), max(cfg.steps, cfg.warmup + 1), cfg.lr * 0.1)
    return optax.inject_hyperparams(optax.adamw)(
        learning_rate=schedule, b1=0.9, b2=0.95, weight_decay=cfg.weight_decay)


def build(cfg: TrainConfig) -> tuple[TrainState, object]:
    mesh = Mesh(dp=cfg.dp, sdp=cfg.sdp, tp=cfg.tp, pp=cfg.pp, collectives=cfg.collectives)
    if cfg.init_from_hf:
        return from_hf(cfg, mesh)
    model_cfg = preset(cfg.model, cfg.preset, attention_impl=cfg.attention)
    return init(model_cfg.build, adamw(cfg), mesh, seed=cfg.seed), model_cfg


def from_hf(cfg: TrainConfig, mesh: Mesh) -> tuple[TrainState, object]:
    """State and model config from the HF checkpoint ``cfg.init_from_hf``."""
    family, _ = hf.load_config(cfg.init_from_hf)
    if family != cfg.model:
        raise ValueError(f"{cfg.init_from_hf} holds a {family} checkpoint but --model is "
                         f"{cfg.model}; pass --model {family}")
    state, model_cfg = hf.init_from_hf(cfg.init_from_hf, adamw(cfg), mesh,
                                       attention_impl=cfg.attention)
    if model_cfg.vocab_size < ByteTokenizer.vocab_size:
        raise ValueError(f"the byte-level trainer needs vocab_size >= "
                         f"{ByteTokenizer.vocab_size}; the checkpoint has {model_cfg.vocab_size}")
    return state, model_cfg


def checkpoints(cfg: TrainConfig, model_cfg) -> CheckpointManager | None:
    """The run's checkpoint manager (None without ``cfg.checkpoint_dir``)."""
    if not cfg.checkpoint_dir:
        return None
    return CheckpointManager(cfg.checkpoint_dir, save_every=cfg.save_every or None,
                             keep=cfg.keep, async_save=cfg.async_checkpoint,
                             model=describe_model(model_cfg, family=cfg.model, preset=cfg.preset))


def _postfix(metrics: dict, seconds: float, tokens: int, flops_per_token: float,
             devices: int, peak: float) -> dict:
    tps = tokens / seconds
    tflops = tps * flops_per_token / devices / 1e12
    return {"loss": f"{float(to_host(metrics['loss'])):.3f}", "tok/s": f"{tps:,.0f}",
            "TFLOP/s/dev": f"{tflops:.3g}", "MFU": f"{100 * tflops * 1e12 / peak:.1f}%"}


def run(cfg: TrainConfig) -> History:
    """Trains for ``cfg.steps`` steps; returns the loss history."""
    state, model_cfg = build(cfg)
    ckpt = checkpoints(cfg, model_cfg)
    if ckpt is not None:
        state = ckpt.resume(state, cfg.resume)
    first = int(to_host(state.step))
    extra = {"train_config": dataclasses.asdict(cfg)}
    tokenizer = ByteTokenizer()
    data = TokenBatches(tokenizer.encode(load_corpus(cfg.data)), cfg.batch_size, cfg.seq_len,
                        cfg.seed)
    train_data, eval_data = data.split()
    train_step = step(losses.causal_lm_loss, microbatches=cfg.microbatches,
                      precision=cfg.precision, remat=cfg.remat, clip_norm=cfg.clip_norm,
                      pipeline=cfg.pipeline, virtual_chunks=cfg.virtual_chunks)
    evaluate = eval_step(losses.causal_lm_loss, precision=cfg.precision)
    flops_per_token = train_flops_per_token(model_cfg, cfg.seq_len)
    peak, peak_source = peak_flops_per_device()
    tqdm.write(f"mesh {state.mesh.shape} | {cfg.model} {cfg.init_from_hf or cfg.preset} | "
               f"peak {peak / 1e12:.3g} TFLOP/s/device ({peak_source})")
    history = History(start_step=first)
    bar = tqdm(range(first, cfg.steps), initial=first, total=cfg.steps,
               disable=not cfg.progress, dynamic_ncols=True)
    for i in bar:
        start = time.perf_counter()
        state, metrics = train_step(state, train_data.batch(i))
        loss = float(to_host(metrics["loss"]))  # waits for the step
        seconds = time.perf_counter() - start
        history.losses.append(loss)
        history.tokens_per_second.append(cfg.batch_size * cfg.seq_len / seconds)
        bar.set_postfix(_postfix(metrics, seconds, cfg.batch_size * cfg.seq_len,
                                 flops_per_token, len(jax.devices()), peak))
        if cfg.eval_every and ((i + 1) % cfg.eval_every == 0 or i + 1 == cfg.steps):
            ev = np.mean([float(to_host(evaluate(state, eval_data.batch(j))["loss"]))
                          for j in range(cfg.eval_batches)])
            history.eval_losses[i + 1] = float(ev)
            tqdm.write(f"step {i + 1}: train loss {loss:.3f}, eval loss {ev:.3f}")
        if ckpt is not None:
            ckpt.save(state, extra=extra)
    if ckpt is not None:
        ckpt.save(state, force=True, extra=extra)
        ckpt.close()
    return history
