"""Embedding lookups from sdp column shards equal lookups in the gathered table,
values and table gradients (float32, exact up to summation order: atol 1e-6)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, PartitionSpec as P

import jaxsmp
from jaxsmp.losses import causal_lm_loss
from jaxsmp.train.embed_lookup import sharded_take


def test_sharded_take_matches_gathered_take():
    mesh = Mesh(np.array(jax.devices()), ("sdp",))
    rng = np.random.default_rng(0)
    table = jnp.asarray(rng.standard_normal((50, 16)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, 50, (16, 5)), jnp.int32)  # repeats included
    weights = jnp.asarray(rng.standard_normal((16, 5, 16)), jnp.float32)

    def loss(lookup, t):
        def body(shard, ids, w):
            return jax.lax.psum((lookup(shard, ids) * w).sum(), "sdp")
        return jax.shard_map(body, mesh=mesh, in_specs=(P(None, "sdp"), P("sdp"), P("sdp")),
                             out_specs=P())(t, tokens, weights)

    ours = lambda shard, ids: sharded_take(shard, ids, jnp.float32)
    gathered = lambda shard, ids: jnp.take(
        jax.lax.all_gather(shard, "sdp", axis=1, tiled=True), ids, axis=0)
    v1, g1 = jax.jit(jax.value_and_grad(lambda t: loss(ours, t)))(table)
    v2, g2 = jax.jit(jax.value_and_grad(lambda t: loss(gathered, t)))(table)
    np.testing.assert_allclose(v1, v2, rtol=1e-6)
    np.testing.assert_allclose(g1, g2, atol=1e-6)
    expected = np.zeros((50, 16), np.float32)
    np.add.at(expected, np.asarray(tokens), np.asarray(weights))
    np.testing.assert_allclose(g1, expected, atol=1e-5)


def test_the_step_looks_embeddings_up_from_shards(tiny_config, tokens):
    # With XLA's collectives the only all-to-all in the step is the sharded lookup's.
    state = jaxsmp.init(tiny_config.build, optax.sgd(0.1),
                        jaxsmp.Mesh(sdp=8, collectives="xla"))
    text = jaxsmp.step(causal_lm_loss).lower(state, {"tokens": tokens}).as_text()
    assert "all_to_all" in text
