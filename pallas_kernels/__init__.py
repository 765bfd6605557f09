"""Attention kernels: Pallas FlashAttention (GPU), blockwise XLA, and a reference.

This package does not import ``jaxsmp``.
"""
from pallas_kernels.attention import attention

__all__ = ["attention"]
