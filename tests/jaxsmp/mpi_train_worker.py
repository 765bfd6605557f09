"""Run under ``mpiexec``: jaxsmp.distributed forms one job from the MPI ranks, then a tiny
GPT-NeoX trains through the Python API with ``collectives="ffi"`` and with ``"xla"`` on each
mesh given (``dp=2,sdp=2`` ...); losses (rel 1e-5) and final parameter shards must agree
(atol 2e-4 after 3 AdamW steps, as in test_step_equivalence.py: AdamW's normalised update
turns float32 reduction-order noise into ~1e-4 parameter differences).
Usage: mpi_train_worker.py MESH [MESH ...]. Prints ``OK <process>``.
"""
import os
import sys

sys.path[:0] = [os.path.join(os.path.dirname(__file__), "..", ".."), os.path.dirname(__file__)]

import jax  # noqa: E402
import numpy as np  # noqa: E402

import jaxsmp  # noqa: E402
from jaxsmp import distributed  # noqa: E402

spec = distributed.initialize()
assert spec is not None and jax.process_count() == spec.num_processes, spec

from conftest import train  # noqa: E402

config = jaxsmp.models.preset("gpt_neox", "tiny", num_hidden_layers=2, attention_impl="reference")
tokens = np.random.default_rng(0).integers(0, 256, (16, 32)).astype(np.int32)


def shards(state) -> list[np.ndarray]:
    return [np.asarray(s.data) for x in jax.tree.leaves(state.params)
            for s in x.addressable_shards]


for mesh_spec in sys.argv[1:]:
    degrees = {k: int(v) for k, v in (kv.split("=") for kv in mesh_spec.split(","))}
    ref_state, ref = train(config, jaxsmp.Mesh(**degrees, collectives="xla"), tokens)
    state, losses = train(config, jaxsmp.Mesh(**degrees, collectives="ffi"), tokens)
    np.testing.assert_allclose(losses, ref, rtol=1e-5, err_msg=mesh_spec)
    for got, want in zip(shards(state), shards(ref_state)):
        np.testing.assert_allclose(got, want, atol=2e-4, err_msg=mesh_spec)
    if jax.process_index() == 0:
        print(f"{mesh_spec} losses: {losses}", flush=True)
print(f"OK {jax.process_index()}", flush=True)
