"""One of N JAX processes on localhost (gloo CPU collectives), D devices each (default 4).

Checks every algorithm's all_gather / reduce_scatter across the process boundary against
numpy (values) and XLA (gradients), and the topology read from the real devices.
Usage: multiprocess_worker.py PROCESS_ID NUM_PROCESSES PORT [D]. Prints ``OK <id>``.
"""
import os
import sys

DEVICES = int(sys.argv[4]) if len(sys.argv) > 4 else 4
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES}"
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
PID, NPROC, PORT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
jax.distributed.initialize(f"127.0.0.1:{PORT}", num_processes=NPROC, process_id=PID,
                           initialization_timeout=60)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import (  # noqa: E402
    Mesh,
    NamedSharding,
    PartitionSpec as P,
)

import collectives  # noqa: E402
from collectives import Topology  # noqa: E402

devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
p = len(devices)
mesh = Mesh(np.array(devices), ("x",))
sharding = NamedSharding(mesh, P("x"))
topo = Topology.for_mesh_axis(mesh, "x")
assert topo == Topology(NPROC, DEVICES) == Topology.from_devices(), topo
rng = np.random.default_rng(0)
G = rng.standard_normal((p * 3, 5, 7)).astype(np.float32)        # all-gather inputs
S = rng.standard_normal((p * 3, 5 * p, 7)).astype(np.float32)    # reduce-scatter inputs
W = rng.standard_normal((p * 3, 5 * p, 7)).astype(np.float32)    # cotangent of the gather
shards_g, shards_s = np.split(G, p), np.split(S, p)
want_ag = np.concatenate(shards_g, axis=1)
want_rs = np.split(sum(shards_s), p, axis=1)


def put(a):
    return jax.make_array_from_callback(a.shape, sharding, lambda idx: a[idx])


def fns(algorithm):
    def both(a, b):
        return (collectives.all_gather(a, "x", axis=1, algorithm=algorithm),
                collectives.reduce_scatter(b, "x", axis=1, algorithm=algorithm))
    sm = jax.shard_map(both, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=(P("x"), P("x")))

    def loss(a, b, w):
        ag, rs = sm(a, b)
        return jnp.sum(ag * w) + jnp.sum(rs * rs)
    return jax.jit(sm), jax.jit(jax.grad(loss, argnums=(0, 1)))


def local(arr):
    return {mesh.devices.tolist().index(s.device): np.asarray(s.data) for s in arr.addressable_shards}


g, s, w = put(G), put(S), put(W)
ref_grads = [local(a) for a in fns("xla")[1](g, s, w)]
for algorithm in ["xla", "ring", "a2a", "hierarchical", "auto"]:
    fwd, grad = fns(algorithm)
    ag, rs = fwd(g, s)
    for r, v in local(ag).items():
        np.testing.assert_allclose(v, want_ag, rtol=1e-6, err_msg=algorithm)
    for r, v in local(rs).items():
        np.testing.assert_allclose(v, want_rs[r], rtol=1e-5, atol=1e-5, err_msg=algorithm)
    for got, want in zip([local(a) for a in grad(g, s, w)], ref_grads):
        for r in got:
            np.testing.assert_allclose(got[r], want[r], rtol=1e-5, atol=1e-5, err_msg=algorithm)
print(f"OK {PID}", flush=True)
