"""The Pallas kernels' launch table: which tiles each kernel takes, and the default
(per-kernel) tiles against a float64 reference, on CPU in interpret mode. That every
entry compiles for H100 and A100 (their shared memory) is
``tests/jaxsmp/test_gpu_compile.py::test_each_pallas_launch_compiles_for_the_gpu``."""
from __future__ import annotations

import pytest
from attention_cases import Case, assert_matches_reference

from pallas_kernels.attention import attention
from pallas_kernels.flash_tuning import KERNELS, LAUNCH, Launch, launch, seq_multiple


def test_a_row_of_q_picks_the_entry_float32_as_twice_the_head_dim() -> None:
    assert launch("forward", 64 * 2, 8192) == LAUNCH["forward"][128]   # bf16, head dim 64
    assert launch("forward", 64 * 4, 8192) == LAUNCH["forward"][256]   # float32, 64
    assert launch("dkv", 128 * 2, 8192) == LAUNCH["dkv"][256]          # bf16, 128
    assert launch("dq", 256 * 4, 8192) == LAUNCH["dq"][1024]           # float32, 256


def test_tiles_are_capped_at_the_sequence_rounded_up_to_a_power_of_two() -> None:
    assert launch("forward", 128, 40) == Launch(64, 64, 4, 3)
    assert launch("dkv", 128, 5) == Launch(16, 16, 4, 3)
    assert seq_multiple(128, 40) == 64 and seq_multiple(128, 8192) == 128


def test_given_tiles_apply_to_every_kernel() -> None:
    for kernel in KERNELS:
        setting = launch(kernel, 256, 8192, block_q=32, block_k=16)
        assert (setting.block_q, setting.block_k) == (32, 16)
    assert seq_multiple(256, 8192, 32, 16) == 32


def test_the_kernels_take_different_tiles_by_default() -> None:
    # what the float64 check below exercises: the forward, dq and dk/dv tiles differ
    tiles = {(launch(k, 64, 200).block_q, launch(k, 64, 200).block_k) for k in KERNELS}
    assert len(tiles) > 1, tiles


@pytest.mark.parametrize("case", [
    Case(200, 2, 1, 16, causal=True, alibi=True, segments=False, seed=40, batch=1),
    Case(136, 2, 2, 16, causal=False, alibi=False, segments=True, seed=41, batch=1),
], ids=str)
def test_default_tiles_match_the_float64_reference(case: Case) -> None:
    """The sequence is padded to every kernel's tiles (to 256 and 256 here), and the
    causal mask is skipped on the tiles left of the diagonal only."""
    def build(inputs):
        def fn(q, k, v):
            return attention(q, k, v, causal=case.causal, alibi_slopes=inputs["alibi_slopes"],
                             segment_ids=inputs["segment_ids"], impl="pallas")
        return fn
    assert_matches_reference(build, case, {"float32": 5e-6})
