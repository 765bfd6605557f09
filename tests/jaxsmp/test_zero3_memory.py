"""ZeRO-3 at sdp=8: per-device state is 1/8, and the compiled step gathers one layer at
a time.

Slack: 4 KiB for the batch, step counter, loss scale and RNG key (the arguments and
outputs of the step besides parameters and optimizer state).
"""
import jax
import numpy as np
import optax
import pytest
from flax import nnx

import jaxsmp
import hlo
from conftest import single_device_mesh
from jaxsmp.losses import causal_lm_loss
from jaxsmp.nn.layer_context import current_layer_context
from jaxsmp.nn.stack import Stack, is_stacked

SLACK = 4096


def _per_device_bytes(tree) -> int:
    return sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(tree))


def _compile(config, mesh, tokens):
    state = jaxsmp.init(config.build, optax.adamw(1e-3), mesh)
    compiled = jaxsmp.step(causal_lm_loss).lower(state, {"tokens": tokens}).compile()
    return state, compiled


@pytest.fixture(scope="module")
def compiled(tiny_config, tokens):
    # XLA's own collectives, so that the compiled module names all-gathers as such
    return {"single": _compile(tiny_config, single_device_mesh(), tokens),
            "sdp8": _compile(tiny_config, jaxsmp.Mesh(sdp=8, collectives="xla"), tokens)}


def test_shard_shapes_are_one_eighth(compiled):
    single, sharded = compiled["single"][0], compiled["sdp8"][0]
    for part in ("params", "opt_state"):
        full = _per_device_bytes(getattr(single, part))
        assert _per_device_bytes(getattr(sharded, part)) <= full / 8 + SLACK
    # gradients have the parameters' shardings (the step's shard_map out_specs)
    assert _per_device_bytes(sharded.params) * 8 == _per_device_bytes(single.params)


def test_compiled_step_memory_is_one_eighth(compiled):
    single, sharded = compiled["single"][1].memory_analysis(), compiled["sdp8"][1].memory_analysis()
    assert sharded.argument_size_in_bytes <= single.argument_size_in_bytes / 8 + SLACK
    assert sharded.output_size_in_bytes <= single.output_size_in_bytes / 8 + SLACK


def check_one_layer_at_a_time(state, compiled_text: str) -> None:
    """From the compiled module: each layer-loop iteration all-gathers exactly one
    layer's parameters (float32 here: tiny GPT-NeoX, 793,088 bytes) and each backward
    iteration reduce-scatters exactly one layer's float32 gradient; no loop gathers
    more, and no all-gather outside the loops is larger than all non-stacked parameters.

    The mutant it must catch (see test_gathering_the_whole_stack_fails_the_check):
    gathering every layer's weights before the scan, which keeps the whole model gathered.
    """
    params = jax.tree.leaves(state.params, is_leaf=lambda x: isinstance(x, nnx.Variable))
    layers = [v for v in params if is_stacked(v)][0].shape[0]
    layer_bytes = sum(v[...].size * 4 for v in params if is_stacked(v)) // layers
    top_bytes = sum(v[...].size * 4 for v in params if not is_stacked(v))
    module = hlo.Module.parse(compiled_text)
    gathers = [hlo.total(loop, "all-gather") for loop in module.loops]
    scatters = [hlo.total(loop, "reduce-scatter", "operand_bytes") for loop in module.loops]
    assert layer_bytes in gathers, (layer_bytes, gathers)
    assert layer_bytes in scatters, (layer_bytes, scatters)
    assert set(gathers) <= {0, layer_bytes} and set(scatters) <= {0, layer_bytes}
    outside = [c.result_bytes for c in module.outside if c.op == "all-gather"]
    assert max(outside) <= top_bytes, (outside, top_bytes)


def test_layers_are_gathered_one_at_a_time(compiled):
    state, step = compiled["sdp8"]
    check_one_layer_at_a_time(state, step.as_text())


def _gather_whole_stack(self, x, *args):
    """The mutant: every layer's parameters gathered before the layer scan."""
    graphdef, params = nnx.split(self.layers)
    full = current_layer_context().gather(params)

    def body(h, layer_params):
        return nnx.merge(graphdef, layer_params)(h, *args), None
    return jax.lax.scan(body, x, full)[0]


def test_gathering_the_whole_stack_fails_the_check(tiny_config, tokens, monkeypatch):
    monkeypatch.setattr(Stack, "__call__", _gather_whole_stack)
    state, step = _compile(tiny_config, jaxsmp.Mesh(sdp=8, collectives="xla"), tokens)
    with pytest.raises(AssertionError, match=r"^\(793088, \[0, 0\]\)"):
        check_one_layer_at_a_time(state, step.as_text())
    module = hlo.Module.parse(step.as_text())  # the whole stack, gathered outside the loops
    assert max(c.result_bytes for c in module.outside if c.op == "all-gather") == 2 * 793088
