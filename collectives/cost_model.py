"""Alpha-beta cost model of the collective algorithms on a two-level topology.

A message of ``b`` bytes over a link costs ``alpha + b / bandwidth``. Inside a host each
device has its own link (``bw_intra``, e.g. NVLink); across hosts all devices of a host
share the host's network bandwidth (``bw_inter``, e.g. EFA). Sizes are per-rank shard
bytes ``n`` (the all-gather input, the reduce-scatter output); all-gather and
reduce-scatter move the same bytes in mirrored order, so they share one model.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from collectives.topology import Topology

MODELED = ("xla", "ring", "a2a", "hierarchical")


@dataclass(frozen=True)
class CostModel:
    alpha_intra: float  # seconds per message inside a host
    bw_intra: float     # bytes/s per device inside a host
    alpha_inter: float  # seconds per message across hosts
    bw_inter: float     # bytes/s per host across hosts
    source: str = "given"

    @classmethod
    def p4d(cls) -> "CostModel":
        """p4d-class node: NVLink ~300 GB/s per GPU, 400 Gbps EFA per node."""
        return cls(alpha_intra=5e-6, bw_intra=300e9, alpha_inter=20e-6, bw_inter=400e9 / 8,
                   source="p4d defaults")

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: str | Path) -> "CostModel":
        return cls(**json.loads(Path(path).read_text()))

    def _round(self, intra_bytes: float, inter_host_bytes: float, hosts: int) -> float:
        """One round where each device sends ``intra_bytes`` in-host and each host
        sends ``inter_host_bytes`` to other hosts, all concurrently."""
        t = self.alpha_intra + intra_bytes / self.bw_intra if intra_bytes else 0.0
        if hosts > 1 and inter_host_bytes:
            t = max(t, self.alpha_inter + inter_host_bytes / self.bw_inter)
        return t

    def predict(self, algorithm: str, nbytes: int, topo: Topology) -> float:
        """Predicted seconds for one all-gather (or reduce-scatter) of ``nbytes`` per rank."""
        h, g = topo.hosts, topo.devices_per_host
        p = h * g
        if p == 1:
            return 0.0
        if algorithm in ("ring", "xla"):  # xla modeled as a NCCL-style ring
            step = self._round(0 if h > 1 else nbytes, nbytes, h)
            return (p - 1) * step
        if algorithm == "a2a":
            return self._round((g - 1) * nbytes, g * (p - g) * nbytes, h)
        if algorithm == "hierarchical":
            across = self._round(0, g * (h - 1) * nbytes, h)
            return across + self._round((g - 1) * h * nbytes, 0, h)
        raise ValueError(f"no cost model for algorithm {algorithm!r}")

    def all_reduce(self, algorithm: str, nbytes: float, topo: Topology) -> float:
        """Predicted seconds for one all-reduce of an ``nbytes`` buffer on every rank: a
        reduce-scatter then an all-gather of ``nbytes / p`` per rank (NCCL's ring)."""
        return 2 * self.predict(algorithm, nbytes / topo.size, topo)

    def send(self, nbytes: float, across_hosts: bool) -> float:
        """Predicted seconds for one point-to-point transfer of ``nbytes``."""
        if across_hosts:
            return self.alpha_inter + nbytes / self.bw_inter
        return self.alpha_intra + nbytes / self.bw_intra

    def sharing_network(self, groups: int) -> "CostModel":
        """This model when ``groups`` collectives run at once on every host: they share
        its network bandwidth (each device keeps its own in-host link)."""
        if groups < 1:
            raise ValueError(f"groups must be >= 1, got {groups}")
        return replace(self, bw_inter=self.bw_inter / groups)


def cross_host_bytes(algorithm: str, nbytes: int, topo: Topology) -> int | None:
    """Bytes that cross host boundaries (summed over hosts) in one collective of
    ``nbytes`` per rank, from the algorithm's pattern; None if XLA decides the pattern."""
    h, g = topo.hosts, topo.devices_per_host
    p = h * g
    if h == 1:
        return 0
    if algorithm == "ring":
        return h * (p - 1) * nbytes
    if algorithm in ("a2a", "ffi"):
        return p * (p - g) * nbytes
    if algorithm == "hierarchical":
        return p * (h - 1) * nbytes
    if algorithm == "xla":
        return None
    raise ValueError(f"unknown algorithm {algorithm!r}")


_current: CostModel | None = None


def set_cost_model(model: CostModel | None) -> None:
    """Use ``model`` (e.g. ``CostModel.load(...)`` from calibrate) for ``algorithm="auto"``;
    None restores the p4d defaults."""
    global _current
    _current = model


def current() -> CostModel:
    return _current or CostModel.p4d()
