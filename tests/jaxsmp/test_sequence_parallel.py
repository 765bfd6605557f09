"""Sequence parallelism: layers take their activations split over tp on the sequence,
gather them for the tensor-parallel matmuls, and keep less per layer.

Gradients equal one device's: tests/jaxsmp/test_step_equivalence.py (the ``-seqpar``
meshes). Measured per extra layer (tiny GPT-NeoX, 16 x 32 tokens, compiled temporaries,
2 -> 6 layers): sdp=4,tp=2 906 -> 742 KB, tp=8 1,978 -> 740 KB.
"""
import hlo
import optax
import pytest

import jaxsmp
from jaxsmp.losses import causal_lm_loss

ACTIVATION = 4 * 32 * 128 * 4  # one sdp=4 device's float32 [batch 4, seq 32, hidden 128]


def _compiled(config, tokens, layers: int, sequence_parallel: bool, **degrees):
    state = jaxsmp.init(config.replace(num_hidden_layers=layers).build, optax.adamw(1e-3),
                        jaxsmp.Mesh(**degrees, collectives="xla"))
    step = jaxsmp.step(causal_lm_loss, sequence_parallel=sequence_parallel)
    return step.lower(state, {"tokens": tokens}).compile()


def _per_layer(config, tokens, sequence_parallel: bool, **degrees) -> float:
    temp = [_compiled(config, tokens, n, sequence_parallel, **degrees)
            .memory_analysis().temp_size_in_bytes for n in (2, 6)]
    return (temp[1] - temp[0]) / 4


@pytest.mark.parametrize("degrees, most", [(dict(sdp=4, tp=2), 0.9), (dict(tp=8), 0.5)],
                         ids=["sdp4-tp2", "tp8"])
def test_layers_keep_less_with_the_sequence_split(tiny_config, tokens, degrees, most):
    split = _per_layer(tiny_config, tokens, True, **degrees)
    whole = _per_layer(tiny_config, tokens, False, **degrees)
    assert split <= most * whole, (split, whole)


def test_the_forward_loop_gathers_the_sequence_over_tp(tiny_config, tokens):
    def sequence_gathers(sequence_parallel):
        text = _compiled(tiny_config, tokens, 4, sequence_parallel, sdp=4, tp=2).as_text()
        forward = hlo.Module.parse(text).loops[0]
        return [c for c in forward if c.op == "all-gather" and c.group == "2"
                and c.result_bytes == ACTIVATION]
    assert len(sequence_gathers(True)) == 2  # the inputs of attention and of the MLP
    assert sequence_gathers(False) == []


def test_sequence_parallel_needs_tp(tiny_config, tokens):
    state = jaxsmp.init(tiny_config.build, optax.sgd(1.0), jaxsmp.Mesh(sdp=8))
    step = jaxsmp.step(causal_lm_loss, sequence_parallel=True)
    with pytest.raises(ValueError, match=r"sequence_parallel=True .* the mesh has tp=1"):
        step(state, {"tokens": tokens})
    with pytest.raises(ValueError, match=r"sequence_parallel must be True or False, got 'yes'"):
        jaxsmp.step(causal_lm_loss, sequence_parallel="yes")


def test_the_trainer_refuses_sequence_parallel_without_tp():
    from jaxsmp.cli.config import ConfigError, make_config
    with pytest.raises(ConfigError, match=r"sequence_parallel .* tp is 1"):
        make_config({"sequence_parallel": True})
    make_config({"sequence_parallel": True, "tp": 2})
