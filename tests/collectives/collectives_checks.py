"""Shared checks (imported by the test modules): an algorithm's collectives against XLA's, values and gradients, on 8 devices."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import collectives

# key -> (mesh shape, mesh axis names, collective axis name, ranks along it)
AXIS_NAMES = {"x": ((8,), ("x",), "x", 8), "ab": ((2, 4), ("a", "b"), ("a", "b"), 8),
              "b": ((2, 4), ("a", "b"), "b", 4), "a": ((2, 4), ("a", "b"), "a", 2)}
DTYPES = [jnp.float32, jnp.bfloat16, jnp.int32]
BASE = (3, 5, 7)  # odd per-rank shape


def random_input(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    if jnp.dtype(dtype) == jnp.float32:
        return rng.standard_normal(shape).astype(np.float32)
    # small integers: sums are exact in bf16 and int32, so results must match exactly
    return rng.integers(-4, 5, size=shape).astype(dtype)


def compare(got, want, dtype):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if jnp.dtype(dtype) == jnp.float32:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(got, want)


def check_against_xla(algorithm: str, mesh_key: str, axis: int, dtype, *,
                      topology=None, grads: bool = True) -> None:
    """all_gather and reduce_scatter with ``algorithm`` equal XLA's, values and gradients."""
    shape, names, axis_name, p = AXIS_NAMES[mesh_key]
    mesh = jax.make_mesh(shape, names)
    rs_local = list(BASE)
    rs_local[axis] *= p
    spec = P(axis_name)
    sharding = NamedSharding(mesh, spec)
    x_ag = jax.device_put(random_input((p * BASE[0],) + BASE[1:], dtype, 0), sharding)
    x_rs = jax.device_put(random_input((p * rs_local[0],) + tuple(rs_local[1:]), dtype, 1), sharding)

    def both(name):
        def f(a, b):
            return (collectives.all_gather(a, axis_name, axis=axis, algorithm=name, topology=topology),
                    collectives.reduce_scatter(b, axis_name, axis=axis, algorithm=name, topology=topology))
        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(spec, spec), out_specs=(spec, spec)))

    got, want = both(algorithm)(x_ag, x_rs), both("xla")(x_ag, x_rs)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        compare(g, w, dtype)
    if not grads or jnp.dtype(dtype) == jnp.int32:
        return
    w_ag = jnp.asarray(random_input(want[0].shape, dtype, 2))
    w_rs = jnp.asarray(random_input(want[1].shape, dtype, 3))

    def loss(name):
        def l(a, b):
            ag, rs = both(name)(a, b)
            return (jnp.sum(ag * w_ag) + jnp.sum(rs * w_rs)).astype(jnp.float32)
        return jax.jit(jax.grad(l, argnums=(0, 1)))

    for g, w in zip(loss(algorithm)(x_ag, x_rs), loss("xla")(x_ag, x_rs)):
        compare(g, w, dtype)

