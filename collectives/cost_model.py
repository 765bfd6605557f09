"""What a collective costs: measured times where calibrated, an alpha-beta model elsewhere.

Alpha-beta: a message of ``b`` bytes over a link costs ``alpha + b / bandwidth``. Inside a
host each device has its own link (``bw_intra``, e.g. NVLink); across hosts all devices of
a host share the host's network bandwidth (``bw_inter``, e.g. EFA). Sizes are per-rank
shard bytes ``n`` (the all-gather input, the reduce-scatter output).

Measured: ``measured[op]["HxG"][algorithm]`` holds ``(bytes, seconds)`` points from
``python -m collectives.calibrate`` for a topology of H hosts x G devices; predictions
interpolate them (log-log), and beyond the largest size scale linearly with bytes. Each
algorithm's time relative to ``xla`` is first smoothed by a median over three neighbouring
sizes: algorithms cross over once as size grows, so a lone win or loss between two sizes
that say otherwise is a disturbed measurement (a shared machine), not a crossover.
``extrapolate`` says whether topologies that were not measured may use the alpha-beta
model (true for GPUs, whose links it describes; false on CPU, where XLA's collectives are
thread rendezvous and memory copies that it does not rank correctly).
"""
from __future__ import annotations

import bisect
import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from collectives.topology import Topology

MODELED = ("xla", "ring", "a2a", "hierarchical")
OPS = ("all_gather", "reduce_scatter")
Points = list[tuple[int, float]]


def topology_key(topo: Topology) -> str:
    return f"{topo.hosts}x{topo.devices_per_host}"


@dataclass(frozen=True)
class CostModel:
    alpha_intra: float  # seconds per message inside a host
    bw_intra: float     # bytes/s per device inside a host
    alpha_inter: float  # seconds per message across hosts
    bw_inter: float     # bytes/s per host across hosts
    source: str = "given"
    bw_host: float = 25e9  # bytes/s device <-> pinned host memory (the ffi CUDA staging)
    extrapolate: bool = True
    measured: dict = field(default_factory=dict, compare=False)

    @classmethod
    def p4d(cls) -> CostModel:
        """Public constants of a p4d-class node: NVLink ~300 GB/s per GPU, 400 Gb/s EFA per
        node, PCIe gen4 x16 ~25 GB/s to host memory. Not measured here."""
        return cls(alpha_intra=5e-6, bw_intra=300e9, alpha_inter=20e-6, bw_inter=400e9 / 8,
                   source="public constants (p4d: NVLink 300 GB/s, EFA 400 Gb/s), not calibrated")

    def save(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        return cls(**json.loads(Path(path).read_text()))

    def measured_algorithms(self, op: str, topo: Topology) -> dict[str, Points]:
        """The calibrated curves for ``op`` on ``topo`` (empty if not calibrated)."""
        return self.measured.get(op, {}).get(topology_key(topo), {})

    def _round(self, intra_bytes: float, inter_host_bytes: float, hosts: int) -> float:
        """One round where each device sends ``intra_bytes`` in-host and each host
        sends ``inter_host_bytes`` to other hosts, all concurrently."""
        t = self.alpha_intra + intra_bytes / self.bw_intra if intra_bytes else 0.0
        if hosts > 1 and inter_host_bytes:
            t = max(t, self.alpha_inter + inter_host_bytes / self.bw_inter)
        return t

    def model(self, algorithm: str, nbytes: int, topo: Topology) -> float:
        """Alpha-beta seconds for one all-gather (or reduce-scatter) of ``nbytes`` per rank."""
        h, g = topo.hosts, topo.devices_per_host
        p = h * g
        if p == 1:
            return 0.0
        if algorithm in ("ring", "xla"):  # xla modeled as a NCCL-style ring
            step = self._round(0 if h > 1 else nbytes, nbytes, h)
            return (p - 1) * step
        if algorithm == "a2a":
            return self._round((g - 1) * nbytes, g * (p - g) * nbytes, h)
        if algorithm in ("hierarchical", "ffi"):
            across = self._round(0, g * (h - 1) * nbytes, h)
            if algorithm == "ffi" and h > 1:  # MPI on host buffers: stage in and out
                across += (nbytes + h * nbytes) / self.bw_host
            return across + self._round((g - 1) * h * nbytes, 0, h)
        raise ValueError(f"no cost model for algorithm {algorithm!r}")

    def predict(self, algorithm: str, nbytes: int, topo: Topology,
                op: str = "all_gather") -> float | None:
        """Seconds for ``op`` of ``nbytes`` per rank: measured if calibrated for this
        topology, else the alpha-beta model if ``extrapolate``, else None (unknown)."""
        curves = self.measured_algorithms(op, topo)
        if algorithm in curves:
            return interpolate(smoothed(curves, algorithm), nbytes)
        if curves or not self.extrapolate:
            return None
        return self.model(algorithm, nbytes, topo)

    def all_reduce(self, algorithm: str, nbytes: float, topo: Topology) -> float:
        """Predicted seconds for one all-reduce of an ``nbytes`` buffer on every rank: a
        reduce-scatter then an all-gather of ``nbytes / p`` per rank (NCCL's ring)."""
        return 2 * self.predict(algorithm, nbytes / topo.size, topo)

    def send(self, nbytes: float, across_hosts: bool) -> float:
        """Predicted seconds for one point-to-point transfer of ``nbytes``."""
        if across_hosts:
            return self.alpha_inter + nbytes / self.bw_inter
        return self.alpha_intra + nbytes / self.bw_intra

    def sharing_network(self, groups: int) -> CostModel:
        """This model when ``groups`` collectives run at once on every host: they share
        its network bandwidth (each device keeps its own in-host link)."""
        if groups < 1:
            raise ValueError(f"groups must be >= 1, got {groups}")
        return replace(self, bw_inter=self.bw_inter / groups)


def smoothed(curves: dict[str, Points], algorithm: str) -> Points:
    """``algorithm``'s points with its ratio to ``xla`` replaced by the median of that ratio
    at the size and its two neighbours (the ends keep theirs); as measured without xla."""
    if "xla" not in curves or algorithm == "xla":
        return sorted(curves[algorithm])
    base = dict(curves["xla"])
    points = sorted((b, t) for b, t in curves[algorithm] if b in base)
    ratios = [t / base[b] for b, t in points]
    out = []
    for i, (b, _) in enumerate(points):
        window = ratios[max(i - 1, 0):i + 2] if 0 < i < len(points) - 1 else [ratios[i]]
        out.append((b, base[b] * sorted(window)[len(window) // 2]))
    return out


def interpolate(points: Points, nbytes: int) -> float:
    """Log-log interpolation of measured ``(bytes, seconds)``; linear in bytes past the end."""
    points = sorted(points)
    sizes = [b for b, _ in points]
    if nbytes <= sizes[0]:
        return points[0][1]
    if nbytes >= sizes[-1]:
        return points[-1][1] * nbytes / sizes[-1]
    i = bisect.bisect_right(sizes, nbytes)
    (b0, t0), (b1, t1) = points[i - 1], points[i]
    w = (math.log(nbytes) - math.log(b0)) / (math.log(b1) - math.log(b0))
    return math.exp((1 - w) * math.log(t0) + w * math.log(t1))


def cross_host_bytes(algorithm: str, nbytes: int, topo: Topology) -> int | None:
    """Bytes that cross host boundaries (summed over hosts) in one collective of
    ``nbytes`` per rank, from the algorithm's pattern; None if XLA decides the pattern."""
    h, g = topo.hosts, topo.devices_per_host
    p = h * g
    if h == 1:
        return 0
    if algorithm == "ring":
        return h * (p - 1) * nbytes
    if algorithm == "a2a":
        return p * (p - g) * nbytes
    if algorithm in ("hierarchical", "ffi"):  # ffi: each process sends its g shards once
        return p * (h - 1) * nbytes
    if algorithm == "xla":
        return None
    raise ValueError(f"unknown algorithm {algorithm!r}")
