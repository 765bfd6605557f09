"""The partitioner balances deliberately unequal layers; manual splits override it.

Margin: with residual MLP blocks whose hidden widths are 4,1,1,1,1,2,2,4 x 128
(compiled FLOPs in the same ratio) a perfectly balanced contiguous split exists for
2 and 4 stages; the predicted largest stage time must be within 5% of the mean.
"""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxsmp.pipeline.partition import partition

WIDTHS = [4, 1, 1, 1, 1, 2, 2, 4]


class Block(nnx.Module):
    def __init__(self, d: int, h: int, rngs: nnx.Rngs):
        self.up, self.down = nnx.Linear(d, h, rngs=rngs), nnx.Linear(h, d, rngs=rngs)

    def __call__(self, x):
        return x + self.down(jax.nn.gelu(self.up(x)))


@pytest.fixture(scope="module")
def layers():
    rngs = nnx.Rngs(0)
    return [Block(128, 128 * k, rngs) for k in WIDTHS]


X = jnp.ones((1024, 128))


def _best_max(loads, stages):
    n = len(loads)
    best = np.inf
    for cuts in itertools.combinations(range(1, n), stages - 1):
        edges = (0, *cuts, n)
        best = min(best, max(sum(loads[a:b]) for a, b in zip(edges[:-1], edges[1:])))
    return best


@pytest.mark.parametrize("stages", [2, 4])
def test_speed_partition_balances_unequal_layers(layers, stages, capsys):
    plan = partition(layers, X, stages)
    assert "predicted balance" in capsys.readouterr().out
    assert sum(plan.counts) == len(WIDTHS) and len(plan.counts) == stages
    assert plan.balance < 1.05
    assert max(plan.stage_time) == pytest.approx(_best_max(plan.layer_time, stages))
    equal = partition(layers, X, stages, manual=[len(WIDTHS) // stages] * stages,
                      verbose=False)
    assert max(equal.stage_time) > 1.1 * max(plan.stage_time)  # 9/8 and 6/4 by widths
    # compiled FLOPs follow the widths
    ratio = np.asarray(plan.layer_time) / plan.layer_time[1]
    np.testing.assert_allclose(ratio, WIDTHS, rtol=0.1)


def test_memory_partition_balances_memory(layers):
    plan = partition(layers, X, 4, optimize="memory", verbose=False)
    assert max(plan.stage_memory) == pytest.approx(_best_max(plan.layer_memory, 4))


def test_embedding_on_first_stage_and_head_on_last(layers):
    embed = nnx.Embed(4096, 128, rngs=nnx.Rngs(1))
    head = nnx.Linear(128, 8192, rngs=nnx.Rngs(2))
    tokens = jnp.zeros((1024,), jnp.int32)
    plain = partition(layers, X, 2, verbose=False)
    with_ends = partition(layers, tokens, 2, embed=embed, head=head, verbose=False)
    assert with_ends.layer_time[-1] > plain.layer_time[-1]      # head charged to the end
    assert with_ends.layer_memory[0] > plain.layer_memory[0]    # embedding to the start
    assert with_ends.counts[1] < plain.counts[1]                # so the last stage shrinks


def test_manual_partition_errors(layers):
    with pytest.raises(ValueError, match="sum to the 8 layers"):
        partition(layers, X, 2, manual=[3, 4], verbose=False)
    with pytest.raises(ValueError, match="at least one layer"):
        partition(layers, X, 3, manual=[4, 4, 0], verbose=False)
    with pytest.raises(ValueError, match="optimize"):
        partition(layers, X, 2, optimize="cost", verbose=False)
