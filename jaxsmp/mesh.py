"""The device mesh: data (dp), expert (ep), sharded data (sdp), context (cp), tensor (tp)
and pipeline (pp) axes."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import jax
import numpy as np

import collectives
from jaxsmp.checks import positive_int

# Outermost to innermost. tp varies fastest, so tp groups, then cp groups and then sdp
# groups are formed from consecutive devices of one host; dp replicas go across hosts.
# ep (expert parallelism) reuses data devices, as MaxText and torchtitan do: the batch is
# split over it too, mixture-of-experts experts are split over it, everything else is
# replicated over it (like dp).
AXES = ("dp", "pp", "ep", "sdp", "cp", "tp")
DATA_AXES = ("dp", "ep", "sdp")   # the batch is split over these
PIPELINE_AXIS = "pp"


def check_collectives(name: str) -> str:
    """``name`` if it names a collectives algorithm (or ``auto``), else a ValueError."""
    valid = sorted(collectives.ALGORITHMS) + ["auto"]
    if name not in valid:
        raise ValueError(f"unknown collectives algorithm {name!r}; valid: {valid}")
    return name


def _device_grid(devices: Sequence[jax.Device], shape: tuple[int, ...]) -> np.ndarray:
    ordered = sorted(devices, key=lambda d: (d.process_index, d.id))
    return np.asarray(ordered, dtype=object).reshape(shape)


def _resolve_degrees(n: int, given: dict[str, int | None]) -> dict[str, int]:
    for name, value in given.items():
        positive_int(f"mesh degree {name}", value, optional=True)
    fixed = {k: v for k, v in given.items() if v is not None}
    defaults = {"dp": 1, "pp": 1, "ep": 1, "cp": 1, "tp": 1}
    missing = [k for k in AXES if given[k] is None]
    if "sdp" in missing:  # sdp takes what is left
        others = {k: fixed.get(k, defaults.get(k, 1)) for k in AXES if k != "sdp"}
        rest = math.prod(others.values())
        degrees = {**others, "sdp": n // rest if n % rest == 0 else 0}
        if degrees["sdp"] < 1:
            raise ValueError(
                f"mesh degrees {others} (product {rest}) do not divide the "
                f"{n} devices, so sdp cannot take the rest")
    else:
        degrees = {k: fixed.get(k, 1) for k in AXES}
    product = math.prod(degrees.values())
    if product != n:
        raise ValueError(
            f"mesh degrees {degrees} multiply to {product}, but there are {n} devices; "
            f"choose degrees whose product is {n}")
    return degrees


@dataclass(frozen=True)
class Mesh:
    """A jaxsmp device mesh. ``sdp`` defaults to whatever the other degrees leave.

    ``Mesh(sdp=4, tp=2)`` on 8 devices: ZeRO-3 over groups of 4, Megatron tensor
    parallelism over pairs. ``cp`` splits every sequence over that many devices
    (context parallelism, :mod:`jaxsmp.context`). ``collectives`` names the algorithm for the sdp
    parameter gather / gradient reduce-scatter (see ``collectives.ALGORITHMS``).
    ``ep`` (expert parallelism) splits a mixture of experts' experts over that many data
    devices, which exchange tokens by all-to-all (``Mesh(ep=2, sdp=4)``: 8 devices, the
    batch split 8 ways, each expert on one ep group of 4, ZeRO-3 over sdp inside;
    docs/moe.md). ``ep`` must divide the expert count, and a model without experts is
    refused (``jaxsmp.init``).
    """
    dp: int | None = None
    sdp: int | None = None
    tp: int | None = None
    pp: int | None = None
    cp: int | None = None
    devices: Sequence[jax.Device] | None = None
    collectives: str = "auto"
    ep: int | None = None
    jax_mesh: jax.sharding.Mesh = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_collectives(self.collectives)
        devices = list(self.devices if self.devices is not None else jax.devices())
        degrees = _resolve_degrees(len(devices), {a: getattr(self, a) for a in AXES})
        for name, value in degrees.items():
            object.__setattr__(self, name, value)
        grid = _device_grid(devices, tuple(degrees[a] for a in AXES))
        object.__setattr__(self, "jax_mesh", jax.sharding.Mesh(grid, AXES))

    @property
    def shape(self) -> dict[str, int]:
        return {a: getattr(self, a) for a in AXES}

    @property
    def data_size(self) -> int:
        """How many ways the global batch is split (dp x ep x sdp)."""
        return self.dp * self.ep * self.sdp

    @property
    def manual_axes(self) -> tuple[str, ...]:
        """The axes the train step handles by hand (``shard_map``). With ``tp = 1``: all
        of them, so kernels GSPMD cannot partition (cuDNN's attention, Pallas) run on
        each device's data as they are. With ``tp > 1`` or ``cp > 1``, which GSPMD places
        (Megatron's splits; the sequence split): the data and pipeline axes of size > 1
        (XLA rejects collectives over size-1 manual axes beside automatic ones)."""
        if self.tp == 1 and self.cp == 1:
            return AXES
        return tuple(a for a in DATA_AXES + (PIPELINE_AXIS,) if getattr(self, a) > 1)

    @property
    def data_axes(self) -> tuple[str, ...]:
        """The manual axes the batch is split over (losses are averaged over them)."""
        return tuple(a for a in self.manual_axes if a in DATA_AXES)

    def sharding(self, spec: jax.sharding.PartitionSpec) -> jax.sharding.NamedSharding:
        return jax.sharding.NamedSharding(self.jax_mesh, spec)

    def __hash__(self) -> int:
        return hash((tuple(self.shape.items()), self.collectives,
                     tuple(d.id for d in self.jax_mesh.devices.flat)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mesh) and hash(self) == hash(other)
