"""Where the stacked layers live for a pipeline schedule.

The stored ``layers`` axis keeps the model's order (rule ``layers -> pp`` when ``pp``
divides it). The stages run a *stage layout*: stage ``s`` holds ``chunks`` chunks of
``slots`` layer slots each; chunk ``c`` of stage ``s`` is virtual stage ``c * pp + s``
and runs ``counts[c * pp + s]`` consecutive layers, its other slots are padding that
the layer scan skips (identity, zero gradient). The step takes the stored parameters
into this layout before its ``shard_map`` (GSPMD moves the layers between stages, once
per step) and the gradients back, so the stored layout, checkpoints and optimizer
state never change. Equal counts with one chunk are the stored layout itself.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxsmp.nn.param import is_var
from jaxsmp.nn.stack import is_stacked


def check_enough(num_layers: int, stages: int, chunks: int) -> None:
    """Every (virtual) stage needs a layer."""
    if num_layers < stages * chunks:
        raise ValueError(
            f"the pipeline needs at least pp x chunks = {stages} x {chunks} = "
            f"{stages * chunks} stacked layers (one per stage), but the model has "
            f"{num_layers}; use fewer stages or chunks")


def equal_counts(num_layers: int, stages: int, chunks: int) -> tuple[int, ...]:
    """``num_layers`` split into ``stages * chunks`` equal virtual stages."""
    parts = stages * chunks
    check_enough(num_layers, stages, chunks)
    if num_layers % parts:
        raise ValueError(
            f"an equal pipeline split needs the {num_layers} stacked layers divisible into "
            f"pp x chunks = {stages} x {chunks} = {parts} equal parts; use "
            f"pipeline_partition='auto' or explicit layer counts, e.g. "
            f"{_example(num_layers, parts)}")
    return (num_layers // parts,) * parts


def _example(num_layers: int, parts: int) -> tuple[int, ...] | str:
    if num_layers < parts:
        return f"(at least {parts} layers are needed)"
    base, extra = divmod(num_layers, parts)
    return tuple(base + (1 <= i <= extra) for i in range(parts))


def check_counts(counts: Any, num_layers: int, stages: int, chunks: int) -> tuple[int, ...]:
    """``counts`` validated: one positive int per virtual stage, summing to the layers."""
    parts = stages * chunks
    ok = (isinstance(counts, (tuple, list)) and len(counts) == parts
          and all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in counts)
          and sum(counts) == num_layers)
    if not ok:
        raise ValueError(
            f"pipeline_partition={counts!r} must give each of the pp x chunks = {parts} "
            f"(virtual) stages at least one layer and sum to the model's {num_layers} "
            f"stacked layers, e.g. {_example(num_layers, parts)}")
    return tuple(counts)


@dataclass(frozen=True)
class StageLayout:
    """``counts[k]``: layers of virtual stage ``k`` (chunk ``k // stages`` of stage
    ``k % stages``), in pipeline order."""
    counts: tuple[int, ...]
    stages: int
    chunks: int = 1

    @property
    def slots(self) -> int:
        """Layer slots per chunk: the largest count."""
        return max(self.counts)

    @property
    def padded(self) -> bool:
        return len(set(self.counts)) > 1

    def active(self) -> np.ndarray:
        """``[stages, chunks]`` layers each chunk runs (its first slots)."""
        return np.asarray(self.counts, np.int32).reshape(self.chunks, self.stages).T

    def slot_layers(self) -> np.ndarray:
        """Stored layer of every slot of the stage layout (stage-major, then chunk, then
        slot); padding slots repeat their chunk's first layer (never run)."""
        starts = np.concatenate([[0], np.cumsum(self.counts)[:-1]])
        out = []
        for s in range(self.stages):
            for c in range(self.chunks):
                k = c * self.stages + s
                n = self.counts[k]
                out += [starts[k] + i if i < n else starts[k] for i in range(self.slots)]
        return np.asarray(out)

    def positions(self) -> np.ndarray:
        """Slot of every stored layer (the inverse of :meth:`slot_layers` on real slots)."""
        layers, active = self.slot_layers(), self.active()
        real = [s * self.chunks * self.slots + c * self.slots + i
                for s in range(self.stages) for c in range(self.chunks)
                for i in range(active[s, c])]
        out = np.empty(sum(self.counts), np.int64)
        out[layers[real]] = real
        return out

    def identity(self) -> bool:
        """Whether the stage layout is the stored one (no reordering, no padding)."""
        layers = self.slot_layers()
        return len(layers) == sum(self.counts) and bool((layers == np.arange(len(layers))).all())

    def to_stages(self, params: Any) -> Any:
        """The stored parameters in the stage layout, its layer axis split over ``pp``
        (a stored layer count ``pp`` does not divide is stored whole on every stage)."""
        if self.identity():
            return params
        return take_stacked(params, params, self.slot_layers(), layers_axis="pp")

    def from_stages(self, grads: Any, params: Any) -> Any:
        """Stage-layout gradients back in the stored layout (padding slots dropped), with
        the stored parameters' metadata: the update adds them to ``params``."""
        if self.identity():
            return grads
        return take_stacked(grads, params, self.positions(), layers_axis=None)


def take_stacked(tree: Any, params: Any, index: np.ndarray, layers_axis: str | None) -> Any:
    """``tree`` (parameters or gradients shaped like ``params``' stage or stored layout)
    with every stacked leaf's layer axis gathered at ``index``. Variables of the result
    get ``layers_axis`` as their layer axis's mesh axis, or with None ``params``' own
    mesh axes (a stored layer count ``pp`` does not divide is not split over ``pp``)."""
    def take(var, leaf: Any) -> Any:
        if not is_stacked(var):
            return leaf
        if not is_var(leaf):
            return jnp.take(leaf, index, axis=0)
        value = jnp.take(leaf[...], index, axis=0)
        axes = (var if layers_axis is None else leaf).get_metadata().get("mesh_axes")
        if layers_axis is not None and axes is not None:
            axes = (layers_axis, *axes[1:])
        return leaf.replace(value, mesh_axes=axes) if axes is not None else leaf.replace(value)
    return jax.tree.map(take, params, tree, is_leaf=is_var)
