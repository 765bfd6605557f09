"""ZeRO-3 at sdp=8: per-device state is 1/8, and the compiled step gathers one layer at
a time. Every weight is gathered here (``activation_gather="never"``): on the tiny model
``auto`` keeps the MLP split and gathers its activations instead
(``test_activation_gather.py``).

Slack: 4 KiB for the batch, step counter, loss scale and RNG key (the arguments and
outputs of the step besides parameters and optimizer state).
"""
import hlo
import jax
import numpy as np
import optax
import pytest
from flax import nnx

import jaxsmp
import jaxsmp.train.forward
from conftest import single_device_mesh
from jaxsmp.losses import causal_lm_loss
from jaxsmp.nn.stack import is_stacked

SLACK = 4096


def _per_device_bytes(tree) -> int:
    return sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(tree))


def _compile(config, mesh, tokens):
    state = jaxsmp.init(config.build, optax.adamw(1e-3), mesh)
    compiled = jaxsmp.step(causal_lm_loss, activation_gather="never").lower(
        state, {"tokens": tokens}).compile()
    return state, compiled


@pytest.fixture(scope="module")
def config(tiny_config):
    return tiny_config.replace(num_hidden_layers=4)  # layer loops of 3 and 2 iterations


@pytest.fixture(scope="module")
def compiled(config, tokens):
    # XLA's own collectives, so that the compiled module names all-gathers as such
    return {"single": _compile(config, single_device_mesh(), tokens),
            "sdp8": _compile(config, jaxsmp.Mesh(sdp=8, collectives="xla"), tokens)}


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
    more, and no all-gather outside the loops (the first layers gathered before a loop
    starts, the top-level parameters) is larger than one layer or all non-stacked
    parameters.

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
    assert max(outside) <= max(layer_bytes, top_bytes), (outside, layer_bytes, top_bytes)


def test_layers_are_gathered_one_at_a_time(compiled):
    state, step = compiled["sdp8"]
    check_one_layer_at_a_time(state, step.as_text())


def _gather_whole_stack(apply, h, shards, args, *, gather, scatter, remat, prefetch,
                        branchless, active=None, kept=None):
    """The mutant: every layer's parameters gathered before the layer scan."""
    full = gather(shards)

    def body(h, layer_params):
        return apply(layer_params, h, args), None
    return jax.lax.scan(body, h, full)[0]


def test_gathering_the_whole_stack_fails_the_check(config, tokens, monkeypatch):
    monkeypatch.setattr(jaxsmp.train.forward, "zero3_scan", _gather_whole_stack)
    state, step = _compile(config, jaxsmp.Mesh(sdp=8, collectives="xla"), tokens)
    with pytest.raises(AssertionError, match=r"^\(793088, \[0, 0\]\)"):
        check_one_layer_at_a_time(state, step.as_text())
    module = hlo.Module.parse(step.as_text())  # the whole stack, gathered outside the loops
    assert max(c.result_bytes for c in module.outside if c.op == "all-gather") == 4 * 793088


def _temp_per_layer(config, tokens, **options) -> float:
    """Growth of the compiled step's temporaries per extra layer (2 -> 6 layers)."""
    def temp(layers):
        c = config.replace(num_hidden_layers=layers)
        state = jaxsmp.init(c.build, optax.adamw(1e-3), jaxsmp.Mesh(sdp=8, collectives="xla"))
        step = jaxsmp.step(causal_lm_loss, activation_gather="never", **options).lower(
            state, {"tokens": tokens})
        return step.compile().memory_analysis().temp_size_in_bytes
    return (temp(6) - temp(2)) / 4


def _autodiff_scan(apply, h, shards, args, *, gather, scatter, remat, prefetch, branchless,
                   active=None, kept=None):
    """The mutant: autodiff of a scan that gathers each layer, keeping every layer's
    gathered weights for the backward pass (jaxsmp before reshard-after-forward)."""
    def body(h, shard):
        return apply(gather(shard), h, args), None
    return jax.lax.scan(body, h, shards)[0]


SHORT = np.random.default_rng(1).integers(0, 256, (8, 16)).astype(np.int32)  # 16 tokens/device


@pytest.mark.parametrize("prefetch", [True, False])
def test_without_remat_layers_keep_activations_not_gathered_weights(config, prefetch):
    # One gathered layer is 793,088 bytes (float32); per layer the step keeps 0.25 MB
    # (activations for 16 tokens per device) without prefetch, 0.34 MB with it (a copy
    # of the stacked gradient shards); keeping gathered weights was 1.03 MB.
    assert _temp_per_layer(config, SHORT, prefetch=prefetch) < 793088


def test_keeping_gathered_weights_fails_the_memory_check(config, monkeypatch):
    monkeypatch.setattr(jaxsmp.train.forward, "zero3_scan", _autodiff_scan)
    assert _temp_per_layer(config, SHORT) > 793088


@pytest.mark.parametrize("prefetch", [True, False])
def test_prefetched_collectives_do_not_wait_for_the_layer_and_it_does_not_wait_for_them(
        config, tokens, prefetch):
    # In the compiled layer loops: the all-gather of the next layer's shard and the
    # reduce-scatter of the previous layer's gradient neither read this iteration's
    # compute nor feed it, so a GPU can run them beside it. The check fails without
    # prefetch, where each iteration gathers the weights it multiplies by.
    state = jaxsmp.init(config.build, optax.adamw(1e-3), jaxsmp.Mesh(sdp=8, collectives="xla"))
    text = jaxsmp.step(causal_lm_loss, prefetch=prefetch, activation_gather="never").lower(
        state, {"tokens": tokens}).compile().as_text()
    found = {op: hlo.collective_dependencies(text, op) for op in ("all-gather", "reduce-scatter")}
    assert len(found["all-gather"]) == 2 and len(found["reduce-scatter"]) == 1  # fwd, bwd
    independent = all(not d["input_waits_for_compute"] and not d["compute_waits_for_result"]
                      for deps in found.values() for d in deps)
    assert independent == prefetch, found
