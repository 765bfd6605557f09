"""The gradient collectives of the step XLA:GPU compiles for 8 H100s (deviceless): the
reduce-scatter runs in the step's ``reduce_dtype``, straight from the bf16 gradients."""
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
