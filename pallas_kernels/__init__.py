"""Attention kernels: Pallas FlashAttention (GPU), blockwise XLA, and a reference.

This package does not import ``jaxsmp``.
"""
from pallas_kernels.alibi import alibi_slopes
from pallas_kernels.attention import attention

__all__ = ["alibi_slopes", "attention"]
