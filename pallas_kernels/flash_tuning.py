"""Launch settings of the Pallas FlashAttention kernels, per kernel and head dim: tile
sizes, warps and software-pipeline stages.

Measured on one H200 (jax 0.11.2, Triton; ``bench/pallas_sweep.py``: seq 8192, causal,
bf16, 2026-11-27); each is the fastest of 48 or within 2% of it where the fastest needs
more shared memory than an A100 has. Keyed by the bytes of a row of q, so float32 takes
the entry of a bfloat16 head dim twice its own; rows of 512 bytes keep the earlier 64 x 64
tiles, 8 warps, 2 stages, and float32 at head dim 256 takes 32 x 32 tiles.
``tests/pallas_kernels/test_flash_tuning.py`` compiles each for H100 and A100.
"""
from __future__ import annotations

from dataclasses import dataclass, replace


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
