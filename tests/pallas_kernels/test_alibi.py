"""Bloom-style ALiBi slopes."""
from __future__ import annotations

import numpy as np
import pytest

from pallas_kernels.alibi import alibi_slopes


def test_power_of_two_heads_are_a_geometric_sequence() -> None:
    np.testing.assert_array_equal(alibi_slopes(8), 2.0 ** -np.arange(1, 9))


def test_non_power_of_two_interleaves_the_next_power_of_two() -> None:
    # Bloom: 4 slopes of the 4-head sequence, then odd powers of the 8-head base (2^-1).
    np.testing.assert_allclose(alibi_slopes(6), [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3])


def test_rejects_zero_heads() -> None:
    with pytest.raises(ValueError, match="num_heads"):
        alibi_slopes(0)
