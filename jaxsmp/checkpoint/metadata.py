"""The JSON metadata saved beside each checkpoint, and the checks run on restore."""
from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping
from typing import Any

import jax

from jaxsmp.checkpoint.errors import CheckpointMismatchError
from jaxsmp.checkpoint.tree import manifest
from jaxsmp.train.state import TrainState

FORMAT = "jaxsmp-checkpoint/1"
# Config fields that choose how a model runs or is initialised, not what its saved
# parameters mean; they may differ between the saving and the resuming run.
RUNTIME_FIELDS = frozenset({"attention_impl", "init_std"})


def describe_model(config: Any, *, family: str | None = None,
                   preset: str | None = None) -> dict:
    """The model identity a checkpoint records and is checked against on restore:
    family, preset name and architecture config (a dataclass or mapping)."""
    fields = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
    described = {"family": family, "preset": preset,
                 "config": {k: v for k, v in fields.items() if k not in RUNTIME_FIELDS}}
    return json.loads(json.dumps(described, default=str))  # as it reads back from disk


def build_metadata(state: TrainState, step: int, model: Mapping | None,
                   extra: Mapping | None) -> dict:
    """Metadata for a save of ``state`` at ``step``. The data position is the step:
    jaxsmp batches are step-indexed, so batch ``step`` is the next one to train on."""
    return {"format": FORMAT, "step": step, "data_position": step,
            "model": dict(model) if model is not None else None,
            "mesh": state.mesh.shape, "devices": state.mesh.jax_mesh.size,
            "processes": jax.process_count(), "jax_version": jax.__version__,
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "arrays": manifest(state), "extra": dict(extra or {})}


def _name(model: Mapping) -> str:
    return f"{model.get('family')} preset {model.get('preset')!r}"


def check_model(saved: Mapping, expected: Mapping | None, where: str) -> None:
    """Raises if ``saved`` metadata records another model than ``expected``."""
    if expected is None or saved.get("model") is None:
        return
    got, want = saved["model"], expected
    diffs = [f"{k}: saved {got.get(k)!r}, expected {want.get(k)!r}"
             for k in ("family", "preset") if got.get(k) != want.get(k)]
    gc, wc = got.get("config") or {}, want.get("config") or {}
    diffs += [f"config.{k}: saved {gc.get(k)!r}, expected {wc.get(k)!r}"
              for k in sorted(set(gc) | set(wc)) if gc.get(k) != wc.get(k)]
    if diffs:
        raise CheckpointMismatchError(
            f"checkpoint {where} was saved from {_name(got)}, but the run expects "
            f"{_name(want)}; differences: " + "; ".join(diffs))


def check_arrays(saved: Mapping, template: TrainState, where: str) -> None:
    """Raises if the saved arrays' names, shapes or dtypes differ from the template's."""
    got, want = saved.get("arrays", {}), manifest(template)
    diffs = [f"{k}: missing from the checkpoint (expected {want[k]['shape']} "
             f"{want[k]['dtype']})" for k in want if k not in got]
    diffs += [f"{k}: in the checkpoint but not in the state" for k in got if k not in want]
    diffs += [f"{k}: saved {got[k]['shape']} {got[k]['dtype']}, expected "
              f"{want[k]['shape']} {want[k]['dtype']}"
              for k in want if k in got and got[k] != want[k]]
    if diffs:
        shown = "; ".join(diffs[:8]) + (f"; ... {len(diffs) - 8} more" if len(diffs) > 8 else "")
        raise CheckpointMismatchError(
            f"checkpoint {where} holds a different training state "
            f"({len(diffs)} array(s) differ; another model or optimizer?): {shown}")
