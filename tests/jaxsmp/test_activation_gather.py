"""Activation gathering (``activation_gather``): the MLP's and the vocabulary
projection's GEMMs keep their weights split over ``sdp`` and gather the batch instead.

Its numerics are held to the single device by ``test_full_step_equivalence.py``
(``sdp8-activation-gather``, and ``auto`` on the tiny model picks the MLP in every
``sdp`` case there). Here: what ``auto`` picks at the widths of the compiled comparison
(``bench/fsdp_compare.py``), what the compiled 8 x H100 program gathers, and the errors.
"""
import re

import jax
import numpy as np
import optax
import pytest

import jaxsmp
from conftest import require_gpu_compiler
from jaxsmp.checkpoint import abstract_state
from jaxsmp.losses import causal_lm_loss
from jaxsmp.plan import gpu_target, hlo_cost
from jaxsmp.plan.compiled_time import rates
from jaxsmp.plan.hardware import GPUS


def _gpu_mesh(**degrees) -> jaxsmp.Mesh:
    require_gpu_compiler()
    return jaxsmp.Mesh(**degrees, devices=gpu_target.topology("H100-SXM", gpus_per_host=8))


def _explained(family: str, preset: str, seq: int, remat: str = "full", **degrees):
    mesh = _gpu_mesh(**degrees)
    config = jaxsmp.models.preset(family, preset).replace(attention_impl="cudnn",
                                                          num_hidden_layers=1)
    state = abstract_state(config.build, optax.adamw(1e-4), mesh)
    tokens = {"tokens": jax.ShapeDtypeStruct((8, seq), np.int32)}
    step = jaxsmp.step(causal_lm_loss, precision="bf16", remat=remat)
    with gpu_target.compiling_for("H100-SXM"):
        return step.explain(state, tokens).activation_gather


def test_auto_gathers_activations_where_a_step_has_few_tokens_per_width():
    """GPT-NeoX-20B width at 2048 tokens per GPU: its MLP and head weights outweigh
    the activations; Llama-2-7B width at 4096: they do not (as GSPMD chooses,
    test_gspmd_contender.py); on sdp=4, tp=2 it does not run."""
    neox = _explained("gpt_neox", "20b", 2048, sdp=8)
    assert neox.value == "mlp, vocab", neox
    assert "mlp:" in neox.why and "vocab:" in neox.why
    assert _explained("llama", "7b", 4096, sdp=8).value == "none"
    tp = _explained("gpt_neox", "20b", 2048, sdp=4, tp=2)
    assert tp.value == "none" and "tp=2" in tp.why, tp


# GPT-NeoX at a width whose MLP and head weights are each larger than the bucket
# (gathered alone, so their shapes show) and than 8 x 64 tokens of activations
CONFIG = jaxsmp.models.preset("gpt_neox", "tiny").replace(
    hidden_size=1024, intermediate_size=4096, num_attention_heads=8, vocab_size=8192,
    num_hidden_layers=2, attention_impl="cudnn")


def _compiled(mode: str) -> str:
    mesh = _gpu_mesh(sdp=8)
    state = abstract_state(CONFIG.build, optax.adamw(1e-4), mesh)
    step = jaxsmp.step(causal_lm_loss, precision="bf16", remat="full",
                       activation_gather=mode)
    tokens = {"tokens": jax.ShapeDtypeStruct((8, 64), np.int32)}
    return gpu_target.compile_step(step, state, tokens, mesh).as_text()


@pytest.fixture(scope="module")
def programs():
    return {mode: _compiled(mode) for mode in ("auto", "never")}


def _gathered_sizes(text: str) -> list[int]:
    """Elements of each all-gather's result."""
    found = []
    for line in text.splitlines():
        if re.search(r" all-gather(-start)?\(", line):
            head = line.split(" all-gather")[0]  # the result shapes, not the operands
            found += [int(np.prod([int(n) for n in s.split(",")]))
                      for s in re.findall(r"bf16\[([\d,]+)\]", head)]
    return found


def test_the_compiled_step_gathers_no_mlp_or_head_weight(programs):
    mlp = CONFIG.hidden_size * CONFIG.intermediate_size
    head = CONFIG.hidden_size * CONFIG.vocab_size
    never, auto = _gathered_sizes(programs["never"]), _gathered_sizes(programs["auto"])
    assert mlp in never and head in never, never  # ZeRO-3 gathers them
    assert mlp not in auto and head not in auto, auto
    assert " all-to-all" in programs["auto"]
    moved = {m: sum(c.nbytes * c.count for c in hlo_cost.estimate(
        programs[m], rates(GPUS["H100-SXM"], "bf16")).collectives) for m in programs}
    assert moved["auto"] < 0.6 * moved["never"], moved


def test_always_on_a_mesh_it_cannot_serve_is_refused_before_compiling():
    state = jaxsmp.init(jaxsmp.models.preset("gpt_neox", "tiny").build, optax.sgd(1.0),
                        jaxsmp.Mesh(sdp=4, tp=2), seed=0)
    step = jaxsmp.step(causal_lm_loss, activation_gather="always")
    with pytest.raises(ValueError, match="activation_gather='always'.*tp=2"):
        step.lower(state, {"tokens": np.zeros((8, 32), np.int32)})


def test_an_unknown_mode_is_refused_when_the_step_is_declared():
    with pytest.raises(ValueError, match="unknown activation_gather 'sometimes'.*auto"):
        jaxsmp.step(causal_lm_loss, activation_gather="sometimes")


@pytest.mark.parametrize("family, preset, seq, degrees, axes", [
    ("gpt_neox", "20b", 2048, (1, 8, 1), {"mlp", "vocab"}),
    ("llama", "7b", 4096, (1, 8, 1), set()),
    ("gpt_neox", "20b", 2048, (1, 4, 2), set())])
def test_the_planner_prices_what_the_step_picks(family, preset, seq, degrees, axes):
    """The planner's candidates (jaxsmp.plan.activation_gather) take the step's own
    choice: the widths of test_auto_gathers_activations_... above."""
    from jaxsmp.plan import Candidate
    from jaxsmp.plan.activation_gather import planned
    from jaxsmp.plan.workload import Workload
    config = jaxsmp.models.preset(family, preset).replace(num_hidden_layers=1)
    dp, sdp, tp = degrees
    candidate = Candidate(dp, sdp, tp, 1, 1, 1, "full", "bf16")
    split = planned(Workload(config, seq), candidate, seq, 2)
    assert split.axes == axes
    assert (split.layer_weights > 0) == ("mlp" in axes)
