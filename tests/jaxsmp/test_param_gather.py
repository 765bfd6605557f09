"""ZeRO-3 under tensor parallelism: a layer's sdp gather moves its tp slices only.

At sdp=4, tp=2 a device needs its tp slice of each Megatron-split weight. Gathering
over sdp inside a region automatic over tp made XLA first all-gather every tp-split
shard over tp (the whole layer, 793,088 bytes, crossed sdp; 0.19-0.99 MB per loop
iteration crossed tp); the gathers now run manual over tp as well (param_gather._over_tp).
Gradients stay equal to one device's: tests/jaxsmp/test_step_equivalence.py (sdp4-tp2).
"""
import hlo
import jax
import optax
import pytest
from flax import nnx

import jaxsmp
import jaxsmp.train.param_gather
from jaxsmp.losses import causal_lm_loss
from jaxsmp.nn.stack import is_stacked
from jaxsmp.train.param_gather import tp_spec


def _layer_bytes(state) -> tuple[int, int]:
    """(float32 bytes of one layer's tp slices, of its parameters split over sdp and tp on
    one dimension, which still cross tp: the 1-D column-parallel biases)."""
    params = jax.tree.leaves(state.params, is_leaf=lambda x: isinstance(x, nnx.Variable))
    stacked = [v for v in params if is_stacked(v)]
    layers = stacked[0].shape[0]

    def local(v):
        return v[...].size * 4 // layers // (2 if "tp" in (tp_spec(v) or ()) else 1)
    return (sum(local(v) for v in stacked),
            sum(local(v) for v in stacked if tp_spec(v) is None))


def check_tp_slices_gathered(state, text: str) -> None:
    """In every layer loop: the sdp (group of 4) all-gathers and reduce-scatters move at
    most one layer's tp slices, and all-gathers over tp (pairs) at most the biases."""
    local, biases = _layer_bytes(state)
    module = hlo.Module.parse(text)
    assert module.loops
    for loop in module.loops:
        sdp_gathered = sum(c.result_bytes for c in loop if c.op == "all-gather" and c.group == "4")
        scattered = sum(c.operand_bytes for c in loop if c.op == "reduce-scatter")
        tp_gathered = sum(c.result_bytes for c in loop if c.op == "all-gather" and c.group == "2")
        assert 0 < sdp_gathered <= local and scattered <= local, (sdp_gathered, scattered, local)
        assert tp_gathered <= biases, (tp_gathered, biases)


@pytest.fixture(scope="module")
def config(tiny_config):
    return tiny_config.replace(num_hidden_layers=4)


def _compiled(config, tokens):
    state = jaxsmp.init(config.build, optax.adamw(1e-3),
                        jaxsmp.Mesh(sdp=4, tp=2, collectives="xla"))
    return state, jaxsmp.step(causal_lm_loss).lower(state, {"tokens": tokens}).compile().as_text()


def test_tp_split_layers_are_gathered_over_sdp_as_tp_slices(config, tokens):
    # tiny GPT-NeoX: one layer's tp slices are 399,872 of its 793,088 bytes
    check_tp_slices_gathered(*_compiled(config, tokens))


def test_gathering_under_automatic_tp_fails_the_check(config, tokens, monkeypatch):
    monkeypatch.setattr(jaxsmp.train.param_gather, "_over_tp", lambda fn, *specs: fn)
    with pytest.raises(AssertionError, match=r"^\(793088, "):
        check_tp_slices_gathered(*_compiled(config, tokens))
