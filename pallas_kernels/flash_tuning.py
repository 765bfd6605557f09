"""Launch settings of the Pallas FlashAttention kernels, per kernel and head dim: tile
sizes, warps and software-pipeline stages.

The entries of 128 and 256 bytes were measured at bf16 head dims 64 and 128 on one H200
(jax 0.11.2, Triton; ``bench/pallas_sweep.py``: seq 8192, causal, 2026-11-27): each is
the fastest of 48 settings, except dk/dv at head dim 64, which takes the second (1.4%
slower, half the query tile: less shared memory). Keyed by the bytes of a row of q, so
smaller head dims take the first entry and float32 the entry of a bfloat16 head dim
twice its own. Rows of 512 bytes keep the earlier 64 x 64
tiles, 8 warps, 2 stages; float32 at head dim 256 takes 32 x 32 tiles, 1 stage, chosen
to fit, not measured. ``tests/jaxsmp/test_gpu_compile.py`` compiles each for H100 and
A100 (``test_each_pallas_launch_compiles_for_the_gpu``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from pallas_kernels.padding import padded_head_dim


@dataclass(frozen=True)
class Launch:
    block_q: int
    block_k: int
    num_warps: int
    num_stages: int


KERNELS = ("forward", "dq", "dkv")
# kernel: {largest bytes of one row of q (padded head dim x item size): launch}; bf16 head
# dim 64 is 128 bytes, 128 is 256, as float32 head dims 32 and 64
SMALL = Launch(32, 32, 4, 1)   # float32 at head dim 256
LAUNCH = {
    "forward": {128: Launch(128, 64, 4, 3), 256: Launch(128, 64, 8, 3),
                512: Launch(64, 64, 8, 2), 1024: SMALL},
    "dq": {128: Launch(128, 64, 4, 3), 256: Launch(128, 64, 8, 3), 512: Launch(64, 64, 8, 2),
           1024: SMALL},
    "dkv": {128: Launch(64, 128, 4, 3), 256: Launch(64, 64, 4, 2), 512: Launch(64, 64, 8, 2),
            1024: SMALL},
}


def row_bytes(head_dim: int, dtype) -> int:
    """The table's key: the bytes of one row of q, its head dim padded as the kernels run
    it (``padding.padded_head_dim``)."""
    return padded_head_dim(head_dim) * np.dtype(dtype).itemsize


def _tile_cap(seq_len: int) -> int:
    """Tiles are powers of two >= 16, at most the sequence rounded up to one."""
    return max(16, 1 << (seq_len - 1).bit_length())


def launch(kernel: str, row_bytes: int, seq_len: int, block_q: int | None = None,
           block_k: int | None = None) -> Launch:
    """``kernel``'s launch for ``row_bytes`` (padded head dim x item size, 32 to 1024): the
    table's tiles capped at ``seq_len`` (rounded up to a power of two), or
    ``block_q``/``block_k`` where given."""
    base = next(setting for largest, setting in LAUNCH[kernel].items() if row_bytes <= largest)
    cap = _tile_cap(seq_len)
    return replace(base, block_q=block_q or min(base.block_q, cap),
                   block_k=block_k or min(base.block_k, cap))


def seq_multiple(row_bytes: int, seq_len: int, block_q: int | None = None,
                 block_k: int | None = None) -> int:
    """The length every kernel's tiles divide: the sequence is padded to a multiple of it."""
    return max(max(s.block_q, s.block_k) for s in
               (launch(k, row_bytes, seq_len, block_q, block_k) for k in KERNELS))


def compiler_params(setting: Launch):
    from jax.experimental.pallas import triton as plgpu  # a GPU module: loaded on use
    return plgpu.CompilerParams(num_warps=setting.num_warps, num_stages=setting.num_stages)
