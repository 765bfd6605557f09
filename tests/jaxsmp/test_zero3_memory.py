"""ZeRO-3 at sdp=8: per-device parameters, gradients and optimizer state are 1/8.

Slack: 4 KiB for the batch, step counter, loss scale and RNG key (the arguments
and outputs of the step besides parameters and optimizer state).
"""
import re

import jax
import optax
import pytest

import jaxsmp
from conftest import single_device_mesh
from jaxsmp.losses import causal_lm_loss

SLACK = 4096


def _per_device_bytes(tree) -> int:
    return sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(tree))


@pytest.fixture(scope="module")
def compiled(tiny_config, tokens):
    out = {}
    # XLA's own collectives: the test reads all_gather ops from the lowered program
    meshes = [("single", single_device_mesh()), ("sdp8", jaxsmp.Mesh(sdp=8, collectives="xla"))]
    for name, mesh in meshes:
        state = jaxsmp.init(tiny_config.build, optax.adamw(1e-3), mesh)
        lowered = jaxsmp.step(causal_lm_loss).lower(state, {"tokens": tokens})
        out[name] = (state, lowered, lowered.compile().memory_analysis())
    return out


def test_shard_shapes_are_one_eighth(compiled):
    single, sharded = compiled["single"][0], compiled["sdp8"][0]
    for part in ("params", "opt_state"):
        full = _per_device_bytes(getattr(single, part))
        assert _per_device_bytes(getattr(sharded, part)) <= full / 8 + SLACK
    # gradients have the parameters' shardings (the step's shard_map out_specs)
    assert _per_device_bytes(sharded.params) * 8 == _per_device_bytes(single.params)


def test_compiled_step_memory_is_one_eighth(compiled):
    single, sharded = compiled["single"][2], compiled["sdp8"][2]
    assert sharded.argument_size_in_bytes <= single.argument_size_in_bytes / 8 + SLACK
    assert sharded.output_size_in_bytes <= single.output_size_in_bytes / 8 + SLACK


def test_layers_are_gathered_one_at_a_time(compiled, tiny_config):
    # No all-gather in the step produces a stacked [layers, ...] parameter.
    text = compiled["sdp8"][1].as_text()
    gathers = [l for l in text.splitlines() if "all_gather" in l]
    assert gathers
    layers = tiny_config.num_hidden_layers
    stacked = [l for l in gathers if re.search(rf"->\s*tensor<{layers}x\d+x", l)]
    assert not stacked, stacked[:2]
