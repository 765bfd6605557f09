"""What a collective costs: measured times where calibrated, a per-step model elsewhere.

Each algorithm is priced step by step, as it runs: a step over a link costs its latency
(``alpha_intra`` inside a host, e.g. an NVLink hop; ``alpha_inter`` across hosts, a network
hop) and its bytes at the link's bandwidth. Inside a host each device has its own link
(``bw_intra``, e.g. NVLink); across hosts all devices of a host share the host's network
bandwidth (``bw_inter``, e.g. EFA: the 8 GPUs of a p4d share its 4 x 100 Gbps). Sizes
are per-rank shard bytes ``n`` (the all-gather input, the reduce-scatter output). The
reference is NCCL's own tuning model (``src/graph/tuning.cc``), whose latencies the
defaults take (:mod:`jaxsmp.plan.hardware`):

- ``xla``: NCCL's ring (what XLA's all-gather and reduce-scatter run on GPUs): ``p - 1``
  steps pipelined in chunks, so each step's latency is paid once (``p - h`` in-host hops,
  ``h - 1`` network hops) and the bytes, ``(p - 1) n`` through every host's network, at the
  slowest link's rate.
- ``ring``: :mod:`collectives.ring`, ``p - 1`` collective-permutes one after the other:
  every step pays the latency and bytes of its slowest link.
- ``a2a``: every rank sends its shard to each other rank at once: one step, its latency
  once, ``g (p - g) n`` bytes through each host's network (``g`` times the ring's).
- ``hierarchical``: a ring over the hosts (the ``g`` devices of a host each in their own
  ring, sharing its network: ``h - 1`` network steps) then an in-host gather of
  ``h n`` (``g - 1`` NVLink steps).
- All-reduce (:meth:`CostModel.all_reduce`): ``ring`` (a reduce-scatter then an all-gather
  of NCCL's ring) or ``tree`` (NCCL's double binary tree: ``2 (g - 1)`` in-host and
  ``2 log2 h`` network latencies, the buffer twice through each host at 92% of the
  ring's bus bandwidth).

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
ALL_REDUCE = ("ring", "tree")
TREE_BANDWIDTH = 0.92   # NCCL's tree all-reduce bus bandwidth over the ring's (tuning.cc)
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
        node, PCIe gen4 x16 ~25 GB/s to host memory; NCCL's per-step latencies (an NVLink
        hop 3.4 us, a network hop 14 us: its tuning model's Simple protocol). Not
        measured here."""
        return cls(alpha_intra=3.4e-6, bw_intra=300e9, alpha_inter=14e-6, bw_inter=400e9 / 8,
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

    def _pipelined_ring(self, nbytes: float, hosts: int, per_host: int) -> float:
        """NCCL's ring all-gather of ``nbytes`` per rank: ``p - 1`` steps pipelined in
        chunks, each step's latency paid once (``p - h`` in-host and ``h - 1`` network
        hops), the bytes at the slowest link's rate."""
        p = hosts * per_host
        latency = (p - hosts) * self.alpha_intra + (hosts - 1) * self.alpha_inter
        bandwidth = (p - 1) * nbytes / self.bw_intra
        if hosts > 1:
            bandwidth = max(bandwidth, (p - 1) * nbytes / self.bw_inter)
        return latency + bandwidth

    def model(self, algorithm: str, nbytes: int, topo: Topology) -> float:
        """Seconds for one all-gather (or reduce-scatter) of ``nbytes`` per rank, step by
        step (see the module docstring)."""
        h, g = topo.hosts, topo.devices_per_host
        p = h * g
        if p == 1:
            return 0.0
        if algorithm == "xla":
            return self._pipelined_ring(nbytes, h, g)
        if algorithm == "ring":
            step = self._round(0 if h > 1 else nbytes, nbytes, h)
            return (p - 1) * step
        if algorithm == "a2a":
            return self._round((g - 1) * nbytes, g * (p - g) * nbytes, h)
        if algorithm in ("hierarchical", "ffi"):
            across = (h - 1) * self._round(0, g * nbytes, h)
            if algorithm == "ffi" and h > 1:  # MPI on host buffers: stage in and out
                across += (nbytes + h * nbytes) / self.bw_host
            return across + (g - 1) * self._round(h * nbytes, 0, h)
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
        """Predicted seconds for one all-reduce of an ``nbytes`` buffer on every rank:
        ``ring``, a reduce-scatter then an all-gather of ``nbytes / p`` per rank (NCCL's
        ring, or the measured ``xla`` curve where calibrated); ``tree``, NCCL's double
        binary tree; ``best``, the faster of the two (NCCL picks by the same model)."""
        h, g = topo.hosts, topo.devices_per_host
        if topo.size == 1:
            return 0.0
        if algorithm == "best":
            return min(self.all_reduce(a, nbytes, topo) for a in ALL_REDUCE)
        if algorithm == "ring":
            curves = self.measured_algorithms("all_gather", topo)
            if "xla" in curves:
                return 2 * interpolate(smoothed(curves, "xla"), nbytes / topo.size)
            return 2 * self._pipelined_ring(nbytes / topo.size, h, g)
        if algorithm == "tree":
            latency = 2 * ((g - 1) * self.alpha_intra
                           + math.ceil(math.log2(h)) * self.alpha_inter)
            rate = min(self.bw_intra, self.bw_inter) if h > 1 else self.bw_intra
            return latency + 2 * nbytes / (TREE_BANDWIDTH * rate)
        raise ValueError(f"no all-reduce model for algorithm {algorithm!r}; "
                         f"modelled: {ALL_REDUCE + ('best',)}")

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
