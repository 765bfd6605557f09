"""Read-only access to the tensors of an HF safetensors checkpoint, by slices.

A checkpoint is ``model.safetensors`` or shards listed by
``model.safetensors.index.json``. Files are memory-mapped by safetensors, and a
slice reads only its own bytes, so no tensor is loaded whole unless asked for.
"""
from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes  # noqa: F401  registers bfloat16 with numpy so safetensors can read it
import numpy as np
from safetensors import safe_open

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


def _weight_map(root: Path) -> dict[str, str]:
    """Tensor name -> file name."""
    if (root / INDEX).is_file():
        return dict(json.loads((root / INDEX).read_text())["weight_map"])
    files = [root / SINGLE] if (root / SINGLE).is_file() else sorted(root.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no {SINGLE}, {INDEX} or *.safetensors in {root}")
    names: dict[str, str] = {}
    for file in files:
        with safe_open(file, "np") as f:
            names.update({k: file.name for k in f.keys()})
    return names


class Checkpoint:
    """Names, shapes and slices of the tensors in the checkpoint directory ``root``."""

    def __init__(self, root: str | Path, prefix: str = ""):
        self.root = Path(root)
        self.files = _weight_map(self.root)
        self._open: dict[str, object] = {}
        # Checkpoints of the bare base model omit its prefix ("transformer." etc.).
        self.strip = bool(prefix) and not any(n.startswith(prefix) for n in self.files)
        self.prefix = prefix

    def _stored(self, name: str) -> str:
        if self.strip and name.startswith(self.prefix):
            return name[len(self.prefix):]
        return name

    def names(self) -> set[str]:
        """Tensor names, with the base-model prefix restored where it was omitted."""
        if not self.strip:
            return set(self.files)
        return {n if n.startswith("lm_head") else self.prefix + n for n in self.files}

    def __contains__(self, name: str) -> bool:
        return self._stored(name) in self.files

    def _slice(self, name: str):
        stored = self._stored(name)
        if stored not in self.files:
            raise KeyError(f"tensor {name!r} is missing from the checkpoint in {self.root}")
        file = self.files[stored]
        if file not in self._open:
            self._open[file] = safe_open(self.root / file, "np")
        return self._open[file].get_slice(stored)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._slice(name).get_shape())

    def dtype(self, name: str) -> str:
        return self._slice(name).get_dtype()

    def read(self, name: str, index: tuple[slice, ...] = ()) -> np.ndarray:
        """The slice ``index`` of tensor ``name`` (only those bytes are read)."""
        part = self._slice(name)
        full = tuple(slice(None) for _ in part.get_shape())
        return np.asarray(part[tuple(index) + full[len(index):]])
