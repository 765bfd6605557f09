"""Checkpoints: save the full training state asynchronously, keep the last K, resume
from the latest, reshard onto another mesh.

    ckpt = jaxsmp.checkpoint.CheckpointManager("ckpt", save_every=100, keep=3,
                                               model=describe_model(cfg, preset="125m"))
    state = ckpt.resume(state)              # latest checkpoint, or state if none
    for i in range(int(state.step), steps):
        state, metrics = train_step(state, data.batch(i))
        ckpt.save(state)                    # every 100 steps, in the background
    ckpt.save(state, force=True); ckpt.close()

    # on another mesh, without allocating the model first:
    template = abstract_state(cfg.build, tx, jaxsmp.Mesh(sdp=4, tp=2))
    state = jaxsmp.checkpoint.restore_latest("ckpt", template)
"""
from jaxsmp.checkpoint.errors import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointExistsError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
)
from jaxsmp.checkpoint.manager import RESUME_MODES, CheckpointManager, restore, restore_latest, save
from jaxsmp.checkpoint.metadata import describe_model
from jaxsmp.checkpoint.template import abstract_state

__all__ = ["RESUME_MODES", "CheckpointCorruptError", "CheckpointError",
           "CheckpointExistsError", "CheckpointManager", "CheckpointMismatchError",
           "CheckpointNotFoundError", "abstract_state", "describe_model", "restore",
           "restore_latest", "save"]
