"""The training loop the examples share: batches read ahead onto the devices, the
compiled step, evaluation, metrics, checkpoints, profiling and a clean stop on
preemption."""
from __future__ import annotations

import dataclasses
import time
from contextlib import ExitStack
from dataclasses import dataclass, field

import jax
import numpy as np

from jaxsmp import losses
from jaxsmp.checkpoint import CheckpointManager, describe_model
from jaxsmp.cli.batches import RunData, run_data
from jaxsmp.cli.build import build, run_mesh
from jaxsmp.cli.config import ConfigError, TrainConfig, flat
from jaxsmp.cli.config_file import save_config
from jaxsmp.cli.preemption import Preempted, StopSignals
from jaxsmp.cli.profile import StepProfiler
from jaxsmp.cli.report import Reporter, Throughput, histogram_values, step_values
from jaxsmp.data.loader import Prefetcher, device_batch
from jaxsmp.metrics import peak_flops_per_device, train_flops_per_token
from jaxsmp.metrics.logger import MetricsLogger
from jaxsmp.train.batch import to_host
from jaxsmp.train.fp8_state import with_fp8
from jaxsmp.train.precision import precision_policy
from jaxsmp.train.state import TrainState
from jaxsmp.train.step import eval_step, step


@dataclass
class History:
    losses: list[float] = field(default_factory=list)
    eval_losses: dict[int, float] = field(default_factory=dict)
    tokens_per_second: list[float] = field(default_factory=list)
    start_step: int = 0  # > 0 when resumed from a checkpoint; losses[k] is step start_step+k
    plot: str | None = None  # the PNG of the loss curves, when a log dir was given


def checkpoints(cfg: TrainConfig, model_cfg) -> CheckpointManager | None:
    """The run's checkpoint manager (None without ``cfg.checkpoint_dir``)."""
    if not cfg.checkpoint_dir:
        return None
    return CheckpointManager(cfg.checkpoint_dir, save_every=cfg.save_every or None,
                             keep=cfg.keep, async_save=cfg.async_checkpoint,
                             model=describe_model(model_cfg, family=cfg.model, preset=cfg.preset))


@dataclass
class Run:
    """Everything one run's steps use, built before the first step."""
    cfg: TrainConfig
    data: RunData
    state: TrainState
    model_cfg: object
    ckpt: CheckpointManager | None
    reporter: Reporter
    logger: MetricsLogger | None
    extra: dict  # saved with each checkpoint

    def evaluate(self, evaluate_step, done: int, history: History) -> None:
        losses_ = [float(to_host(evaluate_step(self.state, device_batch(
            self.data.eval, j, self.state.mesh))["loss"])) for j in range(self.cfg.eval_batches)]
        loss = float(np.mean(losses_))
        history.eval_losses[done] = loss
        self.reporter.print(f"step {done}: train loss {history.losses[-1]:.3f}, "
                            f"eval loss {loss:.3f}")
        if self.logger is not None:
            self.logger.log(done, "eval", {"loss": loss})

    def save(self, force: bool = False) -> bool:
        return self.ckpt is not None and self.ckpt.save(self.state, force=force, extra=self.extra)


def _check_resumed_data(run: Run, first: int) -> None:
    """Says so when a resumed run's batches differ from the checkpointed run's."""
    if run.ckpt is None or first == 0:
        return
    saved = run.ckpt.metadata().get("extra", {}).get("data")
    if saved is not None and saved != run.data.identity:
        changed = sorted(k for k in {**saved, **run.data.identity}
                         if saved.get(k) != run.data.identity.get(k))
        run.reporter.print(f"warning: resuming at step {first} with other data settings "
                           f"({', '.join(changed)}): the batches will not continue the "
                           f"checkpointed run's order")


def _template(cfg: TrainConfig, state: TrainState) -> TrainState:
    """The state a checkpoint of this run restores into: with fp8, one holding amax
    histories as the checkpointed state does (the step adds them at its first call)."""
    if not precision_policy(cfg.step.precision).fp8:
        return state
    return with_fp8(state, cfg.step.fp8_history, cfg.step.fp8_vocab)


def _start(cfg: TrainConfig, stack: ExitStack) -> Run:
    if cfg.checkpoint_dir and cfg.resume == "require":  # fail before building anything
        with CheckpointManager(cfg.checkpoint_dir) as probe:
            probe.require()
    mesh = run_mesh(cfg)  # checks the mesh and the batch fit the devices, compiling nothing
    data = run_data(cfg)
    state, model_cfg = build(cfg, data.vocab_size, mesh)
    ckpt = checkpoints(cfg, model_cfg)
    if ckpt is not None:
        stack.callback(ckpt.close)
        state = ckpt.resume(_template(cfg, state), cfg.resume)
    first = int(to_host(state.step))
    logger = None
    if cfg.log_dir and jax.process_index() == 0:
        logger = stack.enter_context(MetricsLogger(cfg.log_dir))
        save_config(cfg, cfg.log_dir)
    if cfg.checkpoint_dir and jax.process_index() == 0:
        save_config(cfg, cfg.checkpoint_dir)
    reporter = Reporter(cfg, first)
    stack.callback(reporter.close)
    extra = {"train_config": flat(cfg), "data": data.identity}
    run = Run(cfg, data, state, model_cfg, ckpt, reporter, logger, extra)
    _check_resumed_data(run, first)
    return run


def _header(run: Run, peak: float, peak_source: str) -> None:
    cfg = run.cfg
    run.reporter.print(
        f"mesh {run.state.mesh.shape} | {cfg.model} {cfg.init_from_hf or cfg.preset} "
        f"(vocab {run.model_cfg.vocab_size}) | data {run.data.description} | "
        f"peak {peak / 1e12:.3g} TFLOP/s/device ({peak_source})")


def _compiled_steps(cfg: TrainConfig):
    """The train and eval steps, both with every step option of the run: evaluation
    holds the layers as training does (pipeline split), reads the same fp8 histories
    and runs the same kernels and collectives."""
    options = dataclasses.asdict(cfg.step)
    return (step(losses.causal_lm_loss, **options),
            eval_step(losses.causal_lm_loss, **options))


def _call(train_step, state: TrainState, batch, first: bool):
    """One step; on the first, a ValueError (raised while tracing, before compiling: an
    option the mesh or model cannot serve) is a :class:`ConfigError`."""
    try:
        return train_step(state, batch)
    except ValueError as err:
        if not first:
            raise
        raise ConfigError(str(err)) from err


def _explain(run: Run, train_step, batch) -> None:
    """Prints what the step runs on the first batch and why (before it compiles); a
    ValueError (settings the mesh or model cannot serve) is a :class:`ConfigError`."""
    try:
        explanation = train_step.explain(run.state, batch)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    run.reporter.explain(explanation)


def _record(run: Run, history: History, done: int, values: dict) -> None:
    history.losses.append(values["loss"])
    history.tokens_per_second.append(values["tokens_per_second"])
    run.reporter.step(done, values)
    if run.logger is not None:
        run.logger.log(done, "train", values)


def _train(run: Run, history: History, stack: ExitStack) -> None:
    cfg = run.cfg
    train_step, evaluate = _compiled_steps(cfg)
    peak, peak_source = peak_flops_per_device()
    _header(run, peak, peak_source)
    rate = Throughput(cfg.batch_size * cfg.seq_len,
                      train_flops_per_token(run.model_cfg, cfg.seq_len), len(jax.devices()), peak)
    profiler = StepProfiler(cfg.profile_range, cfg.log_dir)
    stack.callback(profiler.stop)
    signals = stack.enter_context(StopSignals())
    batches = iter(stack.enter_context(Prefetcher(
        run.data.train, run.state.mesh, range(history.start_step, cfg.steps), cfg.read_ahead)))
    for done in range(history.start_step + 1, cfg.steps + 1):
        start = time.perf_counter()  # the step's time includes waiting for its batch
        _, batch = next(batches)
        waited = time.perf_counter() - start
        if not history.losses:
            _explain(run, train_step, batch)
        profiler.before(done)
        run.state, metrics = _call(train_step, run.state, batch, first=not history.losses)
        jax.block_until_ready(metrics["loss"])
        values = step_values(metrics, time.perf_counter() - start, rate)
        profiler.after(done, run.state)
        _record(run, history, done, {**values, "data_seconds": waited})
        if run.logger is not None and histogram_values(metrics):
            run.logger.log_histograms(done, "train", histogram_values(metrics))
        if run.data.eval is not None and (done % cfg.eval_every == 0 or done == cfg.steps):
            run.evaluate(evaluate, done, history)
        run.save()
        if signals.requested(done) and done < cfg.steps:
            run.save(force=True)  # no-op when this step was just saved: saved all the same
            raise Preempted(done, signals.received, run.ckpt is not None)


def run(cfg: TrainConfig) -> History:
    """Trains for ``cfg.steps`` steps (in all, counting a resumed checkpoint's);
    returns the loss history. Raises :class:`Preempted` after a stop signal."""
    with ExitStack() as stack:
        run_ = _start(cfg, stack)
        history = History(start_step=int(to_host(run_.state.step)))
        _train(run_, history, stack)
        run_.save(force=True)
    if cfg.log_dir and jax.process_index() == 0:
        history.plot = _plot(cfg.log_dir)
    return history


def _plot(log_dir: str) -> str:
    from jaxsmp.plot import plot_run
    return str(plot_run(log_dir))
