"""Run under ``mpiexec -n N``: the FFI collectives against numpy, one CPU device per process.

Mode ``jit``: independent JAX processes, collectives over MPI_COMM_WORLD under plain jit.
Mode ``timeout``: rank 1 skips a collective; rank 0 must time out with a clear error.
Mode ``shard_map``: jax.distributed over the same processes (process_id = MPI rank), a
mesh of one device per process, the ``ffi`` algorithm inside jax.shard_map; without a mesh
in ``collectives.scope`` a mesh in another order than the ranks is an error, with it the
mesh's order holds.
Prints ``OK <rank>`` on success; any mismatch raises.
"""
import os
import re
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import jax
import jax.numpy as jnp
import numpy as np

from collectives.ffi import ops

RANK, WORLD = ops.rank(), ops.world_size()


def global_input(shape, dtype, seed):
    """Every rank's input, stacked: (WORLD, *shape); small integers so sums are exact."""
    return np.random.default_rng(seed).integers(-4, 5, size=(WORLD,) + shape).astype(dtype)


def expect_gather(stacked, axis):
    return np.concatenate(list(stacked), axis=axis)


def expect_scatter(stacked, axis):
    total = stacked.astype(np.float64).sum(0)
    return np.split(total, WORLD, axis=axis)[RANK]


def check(got, want):
    np.testing.assert_array_equal(np.asarray(got, np.float64), np.asarray(want, np.float64))


def run_jit():
    for dtype in [np.float32, jnp.bfloat16, np.int32]:
        for axis in [0, 1, -1]:
            g = global_input((3, 5, 7), dtype, 0)
            check(jax.jit(lambda v: ops.all_gather(v, None, axis))(g[RANK]), expect_gather(g, axis))
            shape = [3, 5, 7]
            shape[axis] *= WORLD
            s = global_input(tuple(shape), dtype, 1)
            check(jax.jit(lambda v: ops.reduce_scatter(v, None, axis))(s[RANK]),
                  expect_scatter(s, axis))
    # gradients: d/dx sum(all_gather(x) * w) = reduce_scatter(w) = this rank's tile of sum of w
    g = global_input((3, 5, 7), np.float32, 2)
    w = global_input((3, 5 * WORLD, 7), np.float32, 3)
    grad = jax.jit(jax.grad(lambda v: jnp.sum(ops.all_gather(v, None, 1) * w[RANK])))(g[RANK])
    check(grad, expect_scatter(w, 1))
    s = global_input((3 * WORLD, 5), np.float32, 4)
    w2 = global_input((3, 5), np.float32, 5)
    grad = jax.jit(jax.grad(lambda v: jnp.sum(ops.reduce_scatter(v, None, 0) * w2[RANK])))(s[RANK])
    check(grad, expect_gather(w2, 0))


def run_shard_map(port):
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=WORLD, process_id=RANK,
                               initialization_timeout=60)
    from jax.sharding import NamedSharding, PartitionSpec as P

    import collectives
    devices = sorted(jax.devices(), key=lambda d: d.process_index)
    mesh = jax.sharding.Mesh(np.array(devices), ("x",))
    sharding = NamedSharding(mesh, P("x"))
    g = global_input((3, 5, 7), np.float32, 6)
    w = global_input((3, 5 * WORLD, 7), np.float32, 7)

    def loss(v):
        out = collectives.all_gather(v[0], "x", axis=1, algorithm="ffi")
        return jnp.sum(out * w[RANK])

    x = jax.make_array_from_process_local_data(sharding, g[RANK][None])
    fwd = jax.jit(jax.shard_map(lambda v: collectives.all_gather(v[0], "x", axis=1, algorithm="ffi")[None],
                                mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    check(fwd(x).addressable_shards[0].data[0], expect_gather(g, 1))
    grad_fn = jax.jit(jax.shard_map(lambda v: jax.grad(loss)(v), mesh=mesh, in_specs=P("x"),
                                    out_specs=P("x")))
    check(grad_fn(x).addressable_shards[0].data[0], expect_scatter(w, 1))

    # a mesh whose axis index is not the MPI rank must fail loudly, not mix up blocks
    reversed_mesh = jax.sharding.Mesh(np.array(devices[::-1]), ("x",))
    y = jax.make_array_from_process_local_data(NamedSharding(reversed_mesh, P("x")), g[RANK][None])
    bad = jax.jit(jax.shard_map(lambda v: collectives.all_gather(v[0], "x", algorithm="ffi")[None],
                                mesh=reversed_mesh, in_specs=P("x"), out_specs=P("x")))
    try:
        bad(y).block_until_ready()
    except Exception as e:  # XlaRuntimeError carrying the handler's message
        assert "MPI rank" in str(e), e
    else:
        raise AssertionError("reversed mesh was accepted")
    # ... while with the mesh in scope its axis order is the channel's rank order
    with collectives.scope(mesh=reversed_mesh):
        good = jax.jit(jax.shard_map(
            lambda v: collectives.all_gather(v[0], "x", axis=1, algorithm="ffi")[None],
            mesh=reversed_mesh, in_specs=P("x"), out_specs=P("x")))(y)
    check(good.addressable_shards[0].data[0], expect_gather(g[::-1], 1))
    # a scope mesh that is not the shard_map's: the channel ranks disagree, and it says so
    with collectives.scope(mesh=mesh):
        try:
            jax.jit(jax.shard_map(  # a new jit: the scope is read when tracing
                lambda v: collectives.all_gather(v[0], "x", algorithm="ffi")[None],
                mesh=reversed_mesh, in_specs=P("x"), out_specs=P("x")))(y).block_until_ready()
        except Exception as e:
            assert re.search(r"mesh position \d != MPI rank \d in channel", str(e)), e
        else:
            raise AssertionError("a scope mesh other than the shard_map's was accepted")


def run_timeout():
    """Rank 0 gathers, rank 1 never does: rank 0 must fail naming the collective and rank 1."""
    import time

    import collectives
    if RANK == 0:
        try:
            with collectives.scope(timeout=2):
                jax.jit(lambda v: ops.all_gather(v, None, 0))(jnp.ones(4)).block_until_ready()
        except Exception as e:  # JaxRuntimeError carrying the handler's message
            print(f"ERROR {e}", flush=True)
        else:
            raise AssertionError("the gather returned without its peer")
    else:
        time.sleep(4)
    ops._lib.jaxsmp_mpi_barrier()


if __name__ == "__main__":
    mode = sys.argv[1]
    {"jit": run_jit, "timeout": run_timeout}.get(mode, lambda: run_shard_map(sys.argv[2]))()
    print(f"OK {RANK}", flush=True)
