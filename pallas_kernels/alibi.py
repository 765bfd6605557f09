"""ALiBi slopes (Press et al.), computed the way Bloom does."""
from __future__ import annotations

import math

import numpy as np


def alibi_slopes(num_heads: int) -> np.ndarray:
    """Per-head ALiBi slopes, float32 [num_heads]; Bloom's recipe for non-powers of two."""
    if num_heads < 1:
        raise ValueError(f"num_heads must be >= 1, got {num_heads}")
    closest = 2 ** math.floor(math.log2(num_heads))
    base = 2.0 ** (-(2.0 ** -(math.log2(closest) - 3)))
    slopes = base ** np.arange(1, closest + 1, dtype=np.float64)
    if closest != num_heads:
        extra_base = 2.0 ** (-(2.0 ** -(math.log2(2 * closest) - 3)))
        remaining = min(closest, num_heads - closest)
        extra = extra_base ** np.arange(1, 2 * remaining + 1, 2, dtype=np.float64)
        slopes = np.concatenate([slopes, extra])
    return slopes.astype(np.float32)
