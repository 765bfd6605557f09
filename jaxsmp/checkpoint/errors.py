"""Checkpoint errors: each names what is wrong and what was expected."""
from __future__ import annotations


class CheckpointError(Exception):
    """Base class of every jaxsmp checkpoint error."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """A checkpoint was required but the directory holds no complete one."""


class CheckpointMismatchError(CheckpointError, ValueError):
    """The checkpoint was saved from another model, preset or state structure."""


class CheckpointCorruptError(CheckpointError):
    """A checkpoint's files are missing, truncated or unreadable."""


class CheckpointExistsError(CheckpointError, FileExistsError):
    """Saving would overwrite or interleave with existing checkpoints."""
