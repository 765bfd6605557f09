"""Varying-axes types inside ``jax.shard_map``: loop carries and branch outputs must
keep one type, so pipeline buffers are made varying over a fixed set of axes. One home
with the kernels' (:mod:`pallas_kernels.vma`)."""
from pallas_kernels.vma import vary, varying

__all__ = ["vary", "varying"]
