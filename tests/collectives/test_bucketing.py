import jax
import jax.numpy as jnp
import numpy as np
import pytest
from collectives_checks import compare, random_input
from jax.sharding import NamedSharding, PartitionSpec as P

import collectives
from collectives import Topology

P8 = 8
# per-rank shards of one "layer"; axes says which dim each is sharded on
SHARDS = {"w": (5, 3, 7), "b": (3,), "ln": {"scale": (2, 9)}, "emb": (4, 6), "rep": (5,)}
AXES = {"w": 1, "b": 0, "ln": {"scale": -1}, "emb": 0, "rep": None}
DTYPE = {"w": jnp.float32, "b": jnp.float32, "ln": {"scale": jnp.bfloat16},
         "emb": jnp.float32, "rep": jnp.float32}


def _full_shape(shape, ax, scale):
    if ax is None:
        return shape
    s = list(shape)
    s[ax] *= scale
    return tuple(s)


def _global(tree_shapes, axes, dtypes, seed, scale_local):
    """Global inputs stacked over ranks on a new leading dim, and their local shapes."""
    leaves, treedef = jax.tree.flatten(tree_shapes, is_leaf=lambda s: isinstance(s, tuple))
    ax = treedef.flatten_up_to(axes)
    dt = treedef.flatten_up_to(dtypes)
    out = []
    for i, (shape, a, d) in enumerate(zip(leaves, ax, dt)):
        local = _full_shape(shape, a, P8) if scale_local else shape
        out.append(random_input((P8,) + local, d, seed + i))
    return jax.tree.unflatten(treedef, out)


def _run(fn, mesh, tree):
    spec = jax.tree.map(lambda _: P("x"), tree)
    tree = jax.tree.map(lambda a: jax.device_put(a, NamedSharding(mesh, P("x"))), tree)
    sm = jax.shard_map(lambda t: fn(jax.tree.map(lambda a: a[0], t)), mesh=mesh,
                       in_specs=(spec,), out_specs=spec)
    wrapped = jax.jit(lambda t: sm(t))
    return wrapped, tree


def _per_leaf(op):
    def f(t):
        return jax.tree.map(lambda a, ax: a[None] if ax is None else op(a, "x", axis=ax)[None],
                            t, AXES)
    return f


@pytest.mark.parametrize("algorithm", ["xla", "ring", "a2a", "hierarchical"])
def test_tree_gather_and_scatter_equal_per_leaf(algorithm):
    mesh = jax.make_mesh((P8,), ("x",))
    topo = Topology(2, 4)
    gather = lambda t: jax.tree.map(lambda a: a[None], collectives.all_gather_tree(
        t, "x", AXES, algorithm, topology=topo))
    scatter = lambda t: jax.tree.map(lambda a: a[None], collectives.reduce_scatter_tree(
        t, "x", AXES, algorithm, topology=topo))
    for fn, ref, scale, seed in [(gather, _per_leaf(collectives.all_gather), False, 0),
                                 (scatter, _per_leaf(collectives.reduce_scatter), True, 10)]:
        x = _global(SHARDS, AXES, DTYPE, seed, scale)
        f, xs = _run(fn, mesh, x)
        g, _ = _run(ref, mesh, x)
        got, want = f(xs), g(xs)
        jax.tree.map(lambda a, b, d: compare(a, b, d), got, want, DTYPE)

        weights = jax.tree.map(lambda a, d: jnp.asarray(random_input(a.shape, d, 99)), want, DTYPE)

        def loss(h):
            return lambda t: sum(jnp.sum((a * w).astype(jnp.float32)) for a, w in
                                 zip(jax.tree.leaves(h(t)), jax.tree.leaves(weights)))
        got_g = jax.jit(jax.grad(loss(f)))(xs)
        want_g = jax.jit(jax.grad(loss(g)))(xs)
        jax.tree.map(lambda a, b, d: compare(a, b, d), got_g, want_g, DTYPE)


def test_one_gather_for_all_dtypes_one_scatter_per_dtype():
    mesh = jax.make_mesh((P8,), ("x",))
    x = _global(SHARDS, AXES, DTYPE, 0, False)
    f, xs = _run(lambda t: jax.tree.map(lambda a: a[None],
                                        collectives.all_gather_tree(t, "x", AXES, "xla")), mesh, x)
    hlo = f.lower(xs).as_text()
    assert hlo.count("stablehlo.all_gather") == 1  # f32 and bf16 leaves in one byte buffer
    x = _global(SHARDS, AXES, DTYPE, 0, True)
    f, xs = _run(lambda t: jax.tree.map(lambda a: a[None],
                                        collectives.reduce_scatter_tree(t, "x", AXES, "xla")), mesh, x)
    assert f.lower(xs).as_text().count("stablehlo.reduce_scatter") == 2


def test_passthrough_leaf_unchanged():
    mesh = jax.make_mesh((P8,), ("x",))
    x = _global(SHARDS, AXES, DTYPE, 0, False)
    f, xs = _run(lambda t: jax.tree.map(lambda a: a[None],
                                        collectives.all_gather_tree(t, "x", AXES, "ring")), mesh, x)
    np.testing.assert_array_equal(np.asarray(f(xs)["rep"]), np.asarray(x["rep"]))
