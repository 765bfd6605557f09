"""CheckpointManager: save every N steps and at the end, asynchronously, keep the
last K, and resume from the latest complete checkpoint."""
from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from typing import Literal

import jax
import numpy as np

from jaxsmp.checkpoint.errors import CheckpointExistsError, CheckpointNotFoundError
from jaxsmp.checkpoint.metadata import build_metadata
from jaxsmp.checkpoint.restore import read_metadata, restore_step
from jaxsmp.checkpoint.store import open_store, write_args
from jaxsmp.checkpoint.tree import to_nested
from jaxsmp.checks import positive_int
from jaxsmp.train.state import TrainState

ResumeMode = Literal["auto", "require", "never"]
RESUME_MODES = ("auto", "require", "never")
AGREE_TIMEOUT_MS = 600_000   # how long a process waits for process 0's answer
_QUESTIONS = itertools.count()   # one key per question; every process asks alike


def _agreed_isdir(directory: str) -> bool:
    """Whether ``directory`` exists, as process 0 sees it, told to every process through
    JAX's coordination service. Opening orbax's store is a collective, so the processes
    must decide alike whether to open it; each looking for itself disagrees whenever
    process 0 creates the directory in between (the trainer writes its config there),
    and the one that opened the store waits for the others forever."""
    here = os.path.isdir(directory)
    if jax.process_count() == 1:
        return here
    from orbax.checkpoint import multihost
    client = multihost.get_jax_distributed_client()
    key = f"jaxsmp_checkpoint_dir_exists_{next(_QUESTIONS)}"
    if jax.process_index() == 0:
        client.key_value_set(key, str(int(here)))
    return client.blocking_key_value_get(key, AGREE_TIMEOUT_MS) == "1"


def step_of(state: TrainState) -> int:
    """The state's step on this host (also when other processes hold devices)."""
    step = state.step
    if isinstance(step, jax.Array) and not step.is_fully_addressable:
        step = step.addressable_data(0)
    return int(np.asarray(step))


class CheckpointManager:
    """Checkpoints of one training run in ``directory``.

    ``save(state)`` writes when ``state.step`` is a multiple of ``save_every`` (or
    ``force=True``); with ``async_save`` it returns once the arrays are copied off
    the devices and writes in the background. ``keep`` last checkpoints are kept.
    ``model`` (from :func:`describe_model`) is recorded and checked on restore.
    """

    def __init__(self, directory: str | os.PathLike, *, save_every: int | None = None,
                 keep: int | None = 3, async_save: bool = True,
                 model: Mapping | None = None):
        positive_int("save_every", save_every, optional=True)
        positive_int("keep", keep, optional=True)
        self.directory, self.save_every, self.model = os.fspath(directory), save_every, model
        self._options = {"keep": keep, "async_save": async_save}
        self._opened = None  # the orbax store, opened when first needed
        self._current: set[int] = set()  # steps saved or restored by this manager

    @property
    def _store(self):
        """The on-disk store; opening it creates the directory, so a manager that
        only looks for checkpoints in a missing directory creates nothing."""
        if self._opened is None:
            self._opened = open_store(self.directory, **self._options)
        return self._opened

    def all_steps(self) -> list[int]:
        """Steps of complete checkpoints, oldest first."""
        if self._opened is None and not _agreed_isdir(self.directory):
            return []
        return sorted(self._store.all_steps())

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def should_save(self, step: int) -> bool:
        return bool(self.save_every) and step > 0 and step % self.save_every == 0

    def save(self, state: TrainState, *, force: bool = False,
             extra: Mapping | None = None) -> bool:
        """Saves ``state`` if its step is due (or ``force``); returns whether it did.
        A step this manager already saved or restored is skipped; any other existing
        checkpoint of the same step is never overwritten (raises)."""
        step = step_of(state)
        if step in self._current or not (force or self.should_save(step)):
            return False
        if step in self._store.all_steps():
            raise CheckpointExistsError(
                f"a checkpoint for step {step} already exists in {self.directory}; "
                f"refusing to overwrite it (resume from it or use another directory)")
        meta = build_metadata(state, step, self.model, extra)
        self._store.save(step, args=write_args(to_nested(state), meta), force=True)
        self._current.add(step)
        return True

    def wait(self) -> None:
        """Blocks until the background write (if any) is complete and visible."""
        if self._opened is not None:
            self._opened.wait_until_finished()

    def metadata(self, step: int | None = None) -> dict:
        """The JSON metadata saved with ``step`` (default: the latest)."""
        return read_metadata(self._store, self._step_or_latest(step))

    def restore(self, template: TrainState, step: int | None = None) -> TrainState:
        """``template`` filled from checkpoint ``step`` (default: the latest), on
        ``template``'s mesh: the checkpoint is resharded if saved on another one."""
        self.wait()
        step = self._step_or_latest(step)
        state = restore_step(self._store, step, template, self.model)
        self._current.add(step)
        return state

    def resume(self, template: TrainState, mode: ResumeMode = "auto") -> TrainState:
        """The latest checkpoint restored into ``template``, or ``template`` itself if
        there is none and ``mode`` is ``"auto"``. ``"require"`` raises if there is
        none; ``"never"`` raises if there is one (a fresh run would mix with it)."""
        if mode not in RESUME_MODES:
            raise ValueError(f"unknown resume mode {mode!r}; valid: {RESUME_MODES}")
        latest = self.latest_step()
        if latest is None:
            if mode == "require":
                self.require()
            return template
        if mode == "never":
            raise CheckpointExistsError(
                f"{self.directory} already holds checkpoints (steps {self.all_steps()}); "
                f"resume from them or use another directory")
        return self.restore(template, latest)

    def require(self) -> int:
        """The latest complete checkpoint's step; raises :class:`CheckpointNotFoundError`
        (creating nothing) if there is none."""
        return self._step_or_latest(None)

    def close(self) -> None:
        """Waits for pending writes and releases the manager's threads."""
        if self._opened is not None:
            self._opened.wait_until_finished()
            self._opened.close()
            self._opened = None

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _step_or_latest(self, step: int | None) -> int:
        if step is not None:
            return step
        latest = self.latest_step()
        if latest is None and not os.path.isdir(self.directory):
            raise CheckpointNotFoundError(
                f"no checkpoint to resume: directory {os.path.abspath(self.directory)} "
                f"does not exist")
        if latest is None:
            raise CheckpointNotFoundError(
                f"no complete checkpoint in {os.path.abspath(self.directory)} (expected step "
                f"directories written by jaxsmp.checkpoint; interrupted saves are ignored)")
        return latest


def save(directory: str | os.PathLike, state: TrainState, *, model: Mapping | None = None,
         extra: Mapping | None = None) -> None:
    """Saves ``state`` to ``directory`` synchronously (keeping earlier checkpoints)."""
    with CheckpointManager(directory, keep=None, async_save=False, model=model) as m:
        m.save(state, force=True, extra=extra)


def restore(directory: str | os.PathLike, template: TrainState, *, step: int | None = None,
            model: Mapping | None = None) -> TrainState:
    """Checkpoint ``step`` (default: the latest) of ``directory`` on ``template``'s mesh."""
    with CheckpointManager(directory, keep=None, model=model) as m:
        return m.restore(template, step)


def restore_latest(directory: str | os.PathLike, template: TrainState, *,
                   model: Mapping | None = None) -> TrainState:
    """The latest complete checkpoint of ``directory`` on ``template``'s mesh; raises
    :class:`CheckpointNotFoundError` if there is none."""
    return restore(directory, template, model=model)
