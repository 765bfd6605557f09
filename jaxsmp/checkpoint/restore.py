"""Reading a checkpoint into a template state, with validation and clear errors.

Each array is read with the sharding the template wants on its own mesh, so a
checkpoint saved on one mesh restores onto another (other degrees, other device
count) and each host reads only the chunks its shards cover.
"""
from __future__ import annotations

from collections.abc import Mapping

import orbax.checkpoint as ocp

from jaxsmp.checkpoint.errors import CheckpointCorruptError, CheckpointNotFoundError
from jaxsmp.checkpoint.metadata import FORMAT, check_arrays, check_model
from jaxsmp.checkpoint.store import META, STATE, read_meta_args, read_state_args
from jaxsmp.checkpoint.tree import from_nested, restore_target
from jaxsmp.train.state import TrainState


def where(store: ocp.CheckpointManager, step: int) -> str:
    return f"step {step} at {store.directory / str(step)}"


def _others(store: ocp.CheckpointManager, step: int) -> str:
    earlier = [s for s in store.all_steps() if s != step]
    return (f"other complete checkpoints: steps {sorted(earlier)}; move the damaged step "
            f"directory aside to resume from the latest of them" if earlier
            else "there is no other checkpoint in this directory")


def _corrupt(store: ocp.CheckpointManager, step: int, what: str,
             err: Exception) -> CheckpointCorruptError:
    return CheckpointCorruptError(
        f"checkpoint {where(store, step)}: {what} could not be read "
        f"({type(err).__name__}: {' '.join(str(err).split())[:300]}); the files are "
        f"truncated, corrupt or "
        f"not a jaxsmp checkpoint; {_others(store, step)}")


def read_metadata(store: ocp.CheckpointManager, step: int) -> dict:
    """The JSON metadata of ``step``; raises if missing, unreadable or not ours."""
    if step not in store.all_steps():
        raise CheckpointNotFoundError(
            f"no complete checkpoint for step {step} in {store.directory}; "
            f"complete steps: {list(store.all_steps())}")
    try:
        meta = store.restore(step, args=read_meta_args())[META]
    except Exception as err:
        raise _corrupt(store, step, "metadata", err) from err
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise CheckpointCorruptError(
            f"checkpoint {where(store, step)}: metadata format is {found!r}, expected "
            f"{FORMAT!r}; {_others(store, step)}")
    return meta


def restore_step(store: ocp.CheckpointManager, step: int, template: TrainState,
                 model: Mapping | None) -> TrainState:
    """``template`` (concrete or from :func:`abstract_state`) filled with ``step``'s
    arrays, placed in the template's shardings; checks model and structure first."""
    meta = read_metadata(store, step)
    check_model(meta, model, where(store, step))
    check_arrays(meta, template, where(store, step))
    try:
        nested = store.restore(step, args=read_state_args(restore_target(template)))[STATE]
    except Exception as err:
        raise _corrupt(store, step, "arrays", err) from err
    return from_nested(template, nested)
