"""Run under ``mpiexec -n N``: the ffi collectives over sdp groups of real meshes, against xla.

Usage: mpi_groups_worker.py PORT DEVICES_PER_PROCESS MESH [MESH ...], a MESH like
``dp=2,sdp=2`` (axes in jaxsmp's order dp, pp, sdp, tp; the collective runs over ``sdp``).
jax.distributed joins the processes (process_id = MPI rank; gloo carries xla's collectives);
each mesh is checked with the shard_map manual over every axis but ``tp`` (jaxsmp's call
site) for all_gather and reduce_scatter values and gradients. Before that, the ranks trace
two collectives in opposite orders (odd ranks reversed) and run them in the same order:
tags that came from a trace counter would mismatch. Prints ``OK <rank>``.
"""
import os
import sys

PORT, DEVICES = sys.argv[1], int(sys.argv[2])
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES}"
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import jax  # noqa: E402

from collectives.ffi import ops  # noqa: E402  (MPI first: rank and size)

RANK, WORLD = ops.rank(), ops.world_size()
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{PORT}", num_processes=WORLD, process_id=RANK,
                           initialization_timeout=120)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import (  # noqa: E402
    Mesh,
    NamedSharding,
    PartitionSpec as P,
)

import collectives  # noqa: E402

ORDER = ("dp", "pp", "sdp", "tp")
DEVICES_SORTED = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))


def make_mesh(spec: str) -> Mesh:
    sizes = dict(kv.split("=") for kv in spec.split(","))
    names = tuple(a for a in ORDER if a in sizes)
    shape = tuple(int(sizes[a]) for a in names)
    return Mesh(np.array(DEVICES_SORTED).reshape(shape), names)


def check(mesh: Mesh) -> None:
    manual = tuple(a for a in mesh.axis_names if a != "tp")
    p = mesh.shape["sdp"]
    n = int(np.prod([mesh.shape[a] for a in manual]))
    rng = np.random.default_rng(0)
    g = rng.standard_normal((n * 2, 3, 4)).astype(np.float32)
    s = rng.standard_normal((n * 2, 3 * p, 4)).astype(np.float32)
    w = rng.standard_normal((n * 2, 3 * p, 4)).astype(np.float32)
    spec = P(manual)
    put = lambda a: jax.make_array_from_callback(a.shape, NamedSharding(mesh, spec),
                                                 lambda idx: a[idx])
    x, y, cot = put(g), put(s), put(w)

    def run(algorithm):
        def both(a, b):
            return (collectives.all_gather(a, "sdp", axis=1, algorithm=algorithm),
                    collectives.reduce_scatter(b, "sdp", axis=1, algorithm=algorithm))
        sm = jax.shard_map(both, mesh=mesh, in_specs=(spec, spec), out_specs=(spec, spec),
                           axis_names=set(manual))

        def loss(a, b, c):
            ag, rs = sm(a, b)
            return jnp.sum(ag * c) + jnp.sum(rs * rs)
        with collectives.scope(mesh=mesh):
            return jax.jit(sm)(x, y), jax.jit(jax.grad(loss, argnums=(0, 1)))(x, y, cot)

    got, want = run("ffi"), run("xla")
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        for sa, sb in zip(a.addressable_shards, b.addressable_shards):
            np.testing.assert_allclose(np.asarray(sa.data), np.asarray(sb.data), rtol=1e-5,
                                       atol=1e-5, err_msg=str(mesh.shape))


def check_trace_order_does_not_matter() -> None:
    mesh = make_mesh(f"sdp={WORLD * DEVICES}")
    x = jax.make_array_from_callback((mesh.size * 2,), NamedSharding(mesh, P("sdp")),
                                     lambda idx: np.arange(mesh.size * 2, dtype=np.float32)[idx])

    def gather(scale):
        body = lambda v: collectives.all_gather(v * scale, "sdp", algorithm="ffi")
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("sdp"), out_specs=P("sdp")))
    order = [1.0, -1.0] if RANK % 2 == 0 else [-1.0, 1.0]
    with collectives.scope(mesh=mesh):
        compiled = {scale: gather(scale).lower(x).compile() for scale in order}
    # only the first runs: with tags from a trace counter, odd ranks' copy would carry even
    # ranks' other tag and the exchange would wait for messages that never come
    out = compiled[1.0](x)
    want = np.arange(mesh.size * 2, dtype=np.float32)  # every rank: the whole vector
    for shard in out.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), want)


if __name__ == "__main__":
    with collectives.scope(timeout=60):
        check_trace_order_does_not_matter()
        for spec in sys.argv[3:]:
            check(make_mesh(spec))
    print(f"OK {RANK}", flush=True)
