"""The on-disk layer: an orbax CheckpointManager whose steps hold two items,
``state`` (the arrays, written shard by shard by the hosts that own them) and
``meta`` (JSON). Orbax writes each step into a temporary directory and renames it
into place when complete, so a save cut short is never listed as a checkpoint."""
from __future__ import annotations

import os

import orbax.checkpoint as ocp
from orbax.checkpoint.checkpoint_managers import preservation_policy

STATE, META = "state", "meta"


def open_store(directory: str | os.PathLike, *, keep: int | None, async_save: bool,
               read_only: bool = False) -> ocp.CheckpointManager:
    """An orbax manager over ``directory`` keeping the last ``keep`` steps (all if None).
    Temporary directories of interrupted saves are removed on open."""
    options = ocp.CheckpointManagerOptions(
        preservation_policy=preservation_policy.LatestN(keep) if keep else None,
        enable_async_checkpointing=async_save, cleanup_tmp_directories=not read_only,
        create=not read_only, read_only=read_only)
    return ocp.CheckpointManager(
        os.path.abspath(directory), options=options,
        item_handlers={STATE: ocp.StandardCheckpointHandler(),
                       META: ocp.JsonCheckpointHandler()})


def write_args(nested_state: dict, meta: dict) -> ocp.args.Composite:
    return ocp.args.Composite(**{STATE: ocp.args.StandardSave(nested_state),
                                 META: ocp.args.JsonSave(meta)})


def read_meta_args() -> ocp.args.Composite:
    return ocp.args.Composite(**{META: ocp.args.JsonRestore()})


def read_state_args(target: dict) -> ocp.args.Composite:
    return ocp.args.Composite(**{STATE: ocp.args.StandardRestore(target)})
