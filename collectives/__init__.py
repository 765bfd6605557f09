"""Collective algorithms for use inside ``jax.shard_map`` over named mesh axes.

This package does not import ``jaxsmp``. ``jaxsmp`` calls :func:`all_gather` and
:func:`reduce_scatter` for the sharded-data-parallel parameter gather and
gradient reduce-scatter, selecting an algorithm by name.
"""
from collectives.api import ALGORITHMS, all_gather, reduce_scatter

__all__ = ["ALGORITHMS", "all_gather", "reduce_scatter"]
