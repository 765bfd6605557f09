"""What communication costs the planner: the topology of a mesh axis' device group
and the collectives, stage-to-stage sends and context-parallel transfers priced on it
(:class:`collectives.CostModel` plus a launch per call, ``COLLECTIVE_LAUNCH``).
:mod:`jaxsmp.plan.throughput` charges them to a step; :mod:`jaxsmp.plan.compiled_time`
prices a compiled program's collectives with the same functions.
"""
from __future__ import annotations

import collectives
from collectives import CostModel, Topology
from jaxsmp.plan.calibration import ATTENTION_BACKWARD, COLLECTIVE_LAUNCH
from jaxsmp.plan.candidate import Candidate
from jaxsmp.plan.hardware import Cluster
from jaxsmp.plan.workload import Workload


def group_topology(size: int, stride: int, per_host: int) -> tuple[Topology, int]:
    """The topology of a mesh-axis group of ``size`` devices ``stride`` apart (devices
    fill hosts of ``per_host`` in order), and how many such groups share each host."""
    if stride >= per_host:
        return Topology(size, 1), per_host
    inside = min(size, per_host // stride)
    return Topology(size // inside, inside), stride


def axis_cost(cluster: Cluster, size: int, stride: int) -> tuple[Topology, CostModel]:
    """A mesh-axis group's topology and the cost model of its links (the network
    shared by the groups on a host)."""
    topo, sharing = group_topology(size, stride, cluster.node.gpus)
    model = cluster.node.cost_model()
    return topo, (model.sharing_network(sharing) if topo.hosts > 1 else model)


def gather_seconds(cluster: Cluster, size: int, stride: int, shard_bytes: float) -> float:
    """An all-gather (or reduce-scatter) of ``shard_bytes`` per rank, best algorithm."""
    if size == 1:
        return 0.0
    topo, model = axis_cost(cluster, size, stride)
    algorithm = collectives.choose(int(shard_bytes), topo, model)
    return COLLECTIVE_LAUNCH + model.predict(algorithm, shard_bytes, topo)


def all_reduce_seconds(cluster: Cluster, size: int, stride: int, nbytes: float) -> float:
    """An all-reduce of ``nbytes`` per rank: NCCL's ring or tree, the faster."""
    if size == 1:
        return 0.0
    topo, model = axis_cost(cluster, size, stride)
    return COLLECTIVE_LAUNCH + model.all_reduce("best", nbytes, topo)


def context_transfers(w: Workload, c: Candidate, cluster: Cluster, split: int,
                      attention: float) -> tuple[float, float]:
    """Exposed seconds of one layer's cp attention transfers (forward, backward) on one
    device, ``attention``: the forward attention's compute; the strategy is the one
    ``context_parallel="auto"`` picks. cp groups are ``tp``-strided inside a host, at the
    in-host bandwidth tp's all-reduces use.

    ``ulysses``: 4 all-to-alls each way (q, k, v to head-split, the output back), each
    sending (cp-1)/cp of the local [tokens/cp, heads/tp, head_dim] tensor (k and v at
    their kv heads, or at q's when repeated); taken as **exposed** (the kernel waits).
    ``ring``: cp-1 ppermutes of the local k and v forward; backward k, v and float32
    dk, dv for cp-1 steps and one last dk, dv home; taken as **overlapped** with each
    step's block compute, exposed only beyond the attention's own time."""
    if c.cp == 1:
        return 0.0, 0.0
    cbytes = c.compute_bytes
    per_head = c.microbatch_size * w.seq_len // c.cp * (w.hidden // w.heads)
    q = per_head * w.heads / split * cbytes
    kv_heads = w.kv_heads / split
    strategy = w.context_strategy(c.cp, split)
    if strategy == "ulysses" and kv_heads % c.cp:
        kv_heads = w.heads / split       # repeated to one per query head
    kv = per_head * kv_heads * cbytes
    topo, model = axis_cost(cluster, c.cp, c.tp)

    def send(nbytes: float) -> float:
        return COLLECTIVE_LAUNCH + model.send(nbytes, across_hosts=topo.hosts > 1)
    if strategy == "ulysses":
        each_way = 2 * send(q * (c.cp - 1) / c.cp) + 2 * send(kv * (c.cp - 1) / c.cp)
        return each_way, each_way
    grads = 2 * send(kv * 4 / cbytes)                    # float32 dk, dv
    forward = (c.cp - 1) * 2 * send(kv)
    backward = (c.cp - 1) * (2 * send(kv) + grads) + grads
    return (max(0.0, forward - attention),
            max(0.0, backward - ATTENTION_BACKWARD * attention))


def stage_send_seconds(cluster: Cluster, c: Candidate, nbytes: float) -> float:
    """One microbatch's activations from one stage to the next."""
    if c.pp == 1:
        return 0.0
    topo, model = axis_cost(cluster, c.pp, c.sdp * c.cp * c.tp)
    return COLLECTIVE_LAUNCH + model.send(nbytes, across_hosts=topo.hosts > 1)
