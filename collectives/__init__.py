"""Collective algorithms for use inside ``jax.shard_map`` over named mesh axes.

This package does not import ``jaxsmp``. ``jaxsmp`` calls :func:`all_gather` and
:func:`reduce_scatter` for the sharded-data-parallel parameter gather and
gradient reduce-scatter, selecting an algorithm by name (``xla``, ``ring``, ``a2a``,
``hierarchical``, ``ffi`` or ``auto``). What they read besides their arguments (the mesh,
the cost model, the ffi timeout) comes from a ``with collectives.scope(...)`` block.
"""
from collectives.api import ALGORITHMS, all_gather, axis_topology, reduce_scatter
from collectives.auto import choose, decide, explain
from collectives.bucketing import all_gather_tree, reduce_scatter_tree
from collectives.context import Scope, scope
from collectives.cost_model import CostModel, cross_host_bytes
from collectives.layout import axis_names
from collectives.topology import Topology

__all__ = [
    "ALGORITHMS", "CostModel", "Scope", "Topology", "all_gather", "all_gather_tree",
    "axis_names", "axis_topology", "choose", "cross_host_bytes", "decide", "explain", "reduce_scatter",
    "reduce_scatter_tree", "scope",
]
