"""The autodiff stage runner against the same layers applied in sequence.

An MLP stack (``x + tanh(x @ w)`` per layer, a per-example scale as the stack's
argument) through :class:`~jaxsmp.pipeline.StageRunner` on ``p`` simulated devices:
the output and the gradients of every weight and of the input equal the sequential
computation's (float32, rtol 1e-5 of each array's largest entry). The cases cover
``simple``, ``virtual`` with ``p`` dividing ``m`` (groups of ``p`` microbatches, also
several groups) and with ``p`` not dividing ``m`` (stage 0's ring).
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxsmp.pipeline import StageRunner, make_schedule
from jaxsmp.pipeline.schedule import Op

LAYERS, D, ROWS = 8, 16, 2


def _run(h, w, args, *active):
    scale = args[0]

    def layer(x, wi):
        return x + jnp.tanh(x @ wi) * scale[:, None], None
    return jax.lax.scan(layer, h, w)[0]


def _inputs(m, seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    w = jax.random.normal(keys[0], (LAYERS, D, D)) / np.sqrt(D)
    x = jax.random.normal(keys[1], (m * ROWS, D))
    scale = jax.random.uniform(keys[2], (m * ROWS,), minval=0.5, maxval=1.5)
    target = jnp.cos(jnp.arange(m * ROWS * D, dtype=jnp.float32)).reshape(m * ROWS, D)
    return w, x, scale, target


def _pipelined(p, m, v):
    runner = StageRunner(p, m, v)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:p]), ("pp",))

    def loss(w, x, scale, target):
        # stage s holds layers [s * LAYERS/p, ...) split in v chunks: reorder so that
        # chunk c of stage s is virtual stage c * p + s (jaxsmp.pipeline.layout)
        return jnp.sum((runner(_run, x, w, (scale,)) - target) ** 2)
    grad = jax.shard_map(jax.value_and_grad(loss, argnums=(0, 1)), mesh=mesh,
                         in_specs=(P("pp"), P(), P(), P()), out_specs=(P(), (P("pp"), P())))
    return jax.jit(grad)


def _stage_layout(w, p, v):
    """The stored (model-order) layers in the runner's layout: stage s's rows hold
    virtual stages s, p + s, ..., each LAYERS / (p v) layers."""
    n = LAYERS // (p * v)
    order = [(c * p + s) * n + i for s in range(p) for c in range(v) for i in range(n)]
    return w[np.array(order)], np.argsort(order)


def _sequential(w, x, scale, target):
    return jnp.sum((_run(x, w, (scale,)) - target) ** 2)


@pytest.mark.parametrize("p,m,v", [(2, 4, 1), (4, 4, 1), (2, 2, 2), (2, 4, 2), (4, 8, 2),
                                   (4, 4, 2), (2, 3, 2), (4, 6, 2), (2, 4, 4)])
def test_runner_matches_sequential(p, m, v):
    w, x, scale, target = _inputs(m)
    staged, back = _stage_layout(w, p, v)
    loss, (dw, dx) = _pipelined(p, m, v)(staged, x, scale, target)
    ref_loss, (ref_dw, ref_dx) = jax.value_and_grad(_sequential, argnums=(0, 1))(
        w, x, scale, target)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    for got, want in ((np.asarray(dw)[back], ref_dw), (dx, ref_dx)):
        np.testing.assert_allclose(got, want, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (2, 6, 3), (4, 6, 2), (4, 4, 2), (2, 4, 1)])
def test_runner_order_is_the_schedule_table(p, m, v):
    """The runner's items, stage by stage, are the forwards of the virtual/simple table."""
    runner = StageRunner(p, m, v)
    table = make_schedule("virtual" if v > 1 else "simple", p, m, v).table
    for s in range(p):
        forwards = [op for op in table[s] if op is not None and op.kind == "F"]
        items = [runner.item(k) for k in range(m * v)]
        assert forwards == [Op("F", int(j), int(c)) for c, j in items]
        assert table[s].index(forwards[0]) == s  # stage s starts at tick s, no gaps
        assert table[s][s:s + m * v] == tuple(forwards)
