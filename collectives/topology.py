"""Which ranks share a host (a JAX process), read from the devices or given by hand."""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import jax
import numpy as np

from collectives.layout import axis_names


@dataclass(frozen=True)
class Topology:
    """``hosts`` hosts of ``devices_per_host`` devices each; ranks ``h*d .. h*d+d-1`` share host ``h``."""

    hosts: int
    devices_per_host: int

    def __post_init__(self) -> None:
        if self.hosts < 1 or self.devices_per_host < 1:
            raise ValueError(f"invalid topology {self}")

    @property
    def size(self) -> int:
        return self.hosts * self.devices_per_host

    def group_size(self, axis_size: int) -> int:
        """Consecutive ranks of an ``axis_size``-rank collective that share a host."""
        return math.gcd(axis_size, self.devices_per_host)

    @classmethod
    def from_devices(cls, devices: Sequence[jax.Device] | None = None) -> Topology:
        """One host per JAX process (``process_index``); all processes must own as many devices."""
        devices = list(jax.devices() if devices is None else devices)
        per_process = Counter(d.process_index for d in devices)
        counts = set(per_process.values())
        if len(counts) != 1:
            raise ValueError(f"processes own unequal device counts: {dict(per_process)}")
        return cls(hosts=len(per_process), devices_per_host=counts.pop())

    @classmethod
    def for_mesh_axis(cls, mesh: jax.sharding.Mesh, axis_name: str | tuple[str, ...]) -> Topology:
        """Topology of the ranks along ``axis_name`` of ``mesh`` (same for every slice of the
        other axes). Ranks that are not laid out host-contiguously count as one host each."""
        names = axis_names(axis_name)
        others = [n for n in mesh.axis_names if n not in names]
        order = [mesh.axis_names.index(n) for n in others + list(names)]
        p = math.prod(mesh.shape[n] for n in names)
        procs = np.vectorize(lambda d: d.process_index)(mesh.devices).transpose(order).reshape(-1, p)
        for g in sorted({math.gcd(p, k) for k in range(2, p + 1)}, reverse=True):
            blocks = procs.reshape(procs.shape[0], p // g, g)
            same_in_block = (blocks == blocks[:, :, :1]).all()
            distinct_blocks = all(len(set(row[:, 0])) == p // g for row in blocks)
            if same_in_block and distinct_blocks:
                return cls(hosts=p // g, devices_per_host=g)
        return cls(hosts=p, devices_per_host=1)
