"""The layer collectives of the step XLA:GPU compiles for 8 H100s (deviceless): the
reduce-scatter runs in the step's ``reduce_dtype``; with the XLA flags jaxsmp sets on
GPUs every layer's all-gather and reduce-scatter is asynchronous wherever compute could
hide it, with a GEMM beside it wherever one exists (slow)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import optax
import pytest

from conftest import require_gpu_compiler

require_gpu_compiler()

import jaxsmp  # noqa: E402
from jaxsmp.checkpoint import abstract_state  # noqa: E402
from jaxsmp.losses import causal_lm_loss  # noqa: E402
from jaxsmp.plan import gpu_target, hlo_cost  # noqa: E402
from jaxsmp.plan.compiled_time import rates  # noqa: E402
from jaxsmp.plan.hardware import GPUS  # noqa: E402


def _compiled_text(mesh: str, **options) -> str:
    degrees = {k: int(v) for k, v in (p.split("=") for p in mesh.split(","))}
    jmesh = jaxsmp.Mesh(**degrees, devices=gpu_target.topology("H100-SXM", gpus_per_host=8))
    config = jaxsmp.models.preset("llama", "tiny", num_hidden_layers=2, attention_impl="cudnn")
    state = abstract_state(config.build, optax.adamw(1e-4), jmesh)
    tokens = {"tokens": jax.ShapeDtypeStruct((8, 128), np.int32)}
    step = jaxsmp.step(causal_lm_loss, precision="bf16", **options)
    return gpu_target.compile_step(step, state, tokens, jmesh).as_text()


@pytest.mark.parametrize("mesh", ["sdp=8", "sdp=4,tp=2"])
@pytest.mark.parametrize("reduce_dtype, dtype", [("bf16", "bf16"), ("fp32", "f32")])
def test_gradients_are_reduce_scattered_in_the_reduce_dtype(mesh, reduce_dtype, dtype):
    text = _compiled_text(mesh, reduce_dtype=reduce_dtype)
    found = [c for c in hlo_cost.estimate(text, rates(GPUS["H100-SXM"], "bf16")).collectives
             if c.kind == "reduce-scatter"]
    assert found and {c.dtype for c in found} == {dtype}, found


BENCH = Path(__file__).resolve().parents[2] / "bench" / "fsdp_compare.py"


@pytest.fixture(scope="module")
def layer_collectives(tmp_path_factory):
    """Llama-2-7B width, 4 layers (with 2, XLA peels every iteration out of the loops),
    seq 2048, remat full, compiled for 8 x H100 with the XLA flags jaxsmp sets on GPUs (a
    fresh process: XLA reads them once), by the bench."""
    out = tmp_path_factory.mktemp("overlap") / "compare.json"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    run = subprocess.run([sys.executable, str(BENCH), "--contenders", "jaxsmp", "--layers", "4",
                          "--seq", "2048", "--mesh", "sdp=8", "sdp=4,tp=2", "--json", str(out)],
                         env=env, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    return {r["mesh"]: r for r in json.loads(out.read_text())}


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["sdp=8", "sdp=4,tp=2"])
def test_every_layer_gather_and_reduce_scatter_is_asynchronous_on_h100(layer_collectives,
                                                                        mesh):
    """Each layer-sized gather and reduce-scatter is a start / done pair, except at most
    the step's first gather, before any compute (nothing to hide it behind): XLA 0.10
    issues that one asynchronously, 0.11 and 0.12 synchronously."""
    r = layer_collectives[mesh]
    assert all(s.endswith("(first)") and s.startswith("all-gather")
               for s in r["synchronous"]), r
    assert r["collectives"].get("reduce-scatter bf16", 0) > 0, r


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["sdp=8", "sdp=4,tp=2"])
def test_every_layer_gather_and_reduce_scatter_has_a_gemm_beside_it_on_h100(layer_collectives,
                                                                            mesh):
    """In every loop body each layer-sized gather and reduce-scatter has a GEMM between
    its start and done; the only ones without are the step's first gathers (before any
    compute exists) and its last reduce-scatters (after all of it). Fails with XLA's
    default of one collective in flight (``jaxsmp.xla_flags`` sets two): a loop's
    reduce-scatter (sdp=8) or two gathers (sdp=4, tp=2) then have no GEMM beside them."""
    exposed = layer_collectives[mesh]["not overlapped"]
    assert all(e.endswith(("(first)", "(last)")) for e in exposed), exposed
