"""The full step users run (``state, metrics = step(state, batch)``, update applied)
equals the single device on every mesh of the matrix.

Two runs per mesh, each against the same run on one device:

* one SGD step at lr 1000, unclipped: every trainable parameter's
  ``(before - after) / lr`` is within conftest's ``GRAD_RTOL`` (1e-5) of that
  parameter's largest single-device value, and the step's ``grad_norm`` and loss agree
  to 1e-5 (fp8: ``FP8_NORM_RTOL``, ``FP8_LOSS_RTOL``). lr 1000, because at lr 1
  float32 rounding of ``before - after`` hides errors of 1e-4;
* three AdamW steps: losses within 1e-5 (fp8: ``FP8_LOSS_RTOL``), parameters within
  ``ADAMW_ATOL`` (AdamW's normalised update turns float32 reduction-order noise in tiny gradients
  into ~1e-4 differences; fp8: not compared).

The matrix: ZeRO-3, dp replicas, tp, sequence parallelism, cp (both strategies), every
pipeline schedule with equal, unequal and ``auto`` splits of layer counts ``pp`` does
not divide, the spread head, microbatches, remat (``offload`` is refused on XLA:CPU,
which drops host offloads; ``test_gpu_compile.py`` compiles it for H100), and fp8.
The gradient matrices (``test_step_equivalence.py``, ``test_pipeline_unequal.py``,
``test_context_parallel.py``) check ``step.gradients()`` as well.
"""
import functools

import jax
import numpy as np
import pytest

import jaxsmp
from conftest import assert_gradients_match, sgd_update, single_device_mesh, train
from jaxsmp.train.fp8_state import trainable

SLOW = pytest.mark.slow
# fp8 against one device in fp8: the same quantized values (the amax observations are
# the global maxima on every mesh, test_fp8_state.py) summed in another order, and a
# float8 rounding that flips moves a value by a step of its 2-3 bit mantissa. Measured on
# pp2-sdp4 1F1B with fp8_vocab: the first loss 1.5e-4 apart, AdamW's third 1.2e-3.
FP8_LOSS_RTOL, FP8_NORM_RTOL = 5e-3, 1e-2
# parameters after three AdamW steps at lr 1e-3: its normalised update moves a parameter
# with a tiny gradient by up to lr a step whatever the gradient's last bits, so float32
# reduction-order noise shows as ~1e-4 (measured up to 2.0002e-4, 1 of 32768 elements,
# on pp2-sdp2-tp2-1f1b-64 with XLA:CPU's LLVM optimizations off). The gradients themselves
# are held to 1e-5 by the SGD step above.
ADAMW_ATOL = 3e-4

# id: (model, rows of tokens, mesh degrees, step options, default selection?)
CASES = {
    "sdp8": ("l4", 16, dict(sdp=8), {}, True),
    "sdp8-micro2-remat-full": ("l4", 16, dict(sdp=8), dict(microbatches=2, remat="full"),
                               True),
    # the MLP and head split over sdp, the batch gathered (auto picks the MLP alone on
    # the tiny model, in every sdp case above and below)
    "sdp8-activation-gather": ("l4", 16, dict(sdp=8), dict(activation_gather="always"),
                               True),
    "dp2-sdp4-activation-gather-micro2-remat": ("l4", 16, dict(dp=2, sdp=4), dict(
        activation_gather="always", microbatches=2, remat="full"), False),
    # jaxsmp's own prefetch (on GPUs where XLA does not pipeline): the moved shards are
    # kept as residuals while the next layer's gather travels in the scan carry
    "sdp8-activation-gather-prefetch-remat": ("l4", 16, dict(sdp=8), dict(
        activation_gather="always", prefetch=True, remat="full"), False),
    "sdp4-tp2-seqpar-save-matmuls": ("l4", 16, dict(sdp=4, tp=2),
                                     dict(sequence_parallel=True, remat="save_matmuls"), False),
    "dp2-sdp2-tp2": ("l4", 16, dict(dp=2, sdp=2, tp=2), {}, False),
    "dp4-tp2-micro2": ("l4", 16, dict(dp=4, tp=2), dict(microbatches=2), False),
    "tp8-seqpar": ("l4", 16, dict(tp=8), dict(sequence_parallel=True), False),
    "pp2-sdp4-simple": ("l4", 16, dict(pp=2, sdp=4), dict(microbatches=4, pipeline="simple"),
                        False),
    "pp2-sdp4-1f1b": ("l4", 16, dict(pp=2, sdp=4), dict(microbatches=4,
                                                        pipeline="interleaved"), False),
    "pp2-sdp4-virtual": ("l4", 16, dict(pp=2, sdp=4), dict(microbatches=4, pipeline="virtual"),
                         False),
    "pp2-sdp2-tp2-seqpar-remat": ("l4", 16, dict(pp=2, sdp=2, tp=2), dict(
        microbatches=4, sequence_parallel=True, remat="full"), False),
    # layer counts pp does not divide: 10 layers on 4 stages, explicit and auto splits
    "pp4-sdp2-simple-2332": ("l10", 16, dict(pp=4, sdp=2), dict(
        microbatches=4, pipeline="simple", pipeline_partition=(2, 3, 3, 2)), True),
    "pp4-sdp2-1f1b-2332": ("l10", 16, dict(pp=4, sdp=2), dict(
        microbatches=4, pipeline="interleaved", pipeline_partition=(2, 3, 3, 2)), True),
    "pp4-sdp2-virtual-12111121": ("l10", 16, dict(pp=4, sdp=2), dict(
        microbatches=4, pipeline="virtual", pipeline_partition=(1, 2, 1, 1, 1, 1, 2, 1)),
                                  False),
    "pp4-sdp2-simple-auto": ("l10", 16, dict(pp=4, sdp=2), dict(
        microbatches=4, pipeline="simple", pipeline_partition="auto"), False),
    "pp4-sdp2-1f1b-auto-remat": ("l10", 16, dict(pp=4, sdp=2), dict(
        microbatches=4, pipeline="interleaved", pipeline_partition="auto", remat="full"),
                                 False),
    "pp4-sdp2-virtual-auto": ("l10", 16, dict(pp=4, sdp=2), dict(
        microbatches=4, pipeline="virtual", pipeline_partition="auto"), False),
    "pp2-sdp2-tp2-1f1b-64": ("l10", 16, dict(pp=2, sdp=2, tp=2), dict(
        microbatches=4, pipeline="interleaved", pipeline_partition=(6, 4)), False),
    "dp2-pp2-sdp2-simple-37": ("l10", 16, dict(dp=2, pp=2, sdp=2), dict(
        microbatches=4, pipeline="simple", pipeline_partition=(3, 7)), False),
    # the head spread over the stages (1F1B): pp divides each microbatch's examples
    "pp4-sdp2-1f1b-spread-2332": ("l10", 32, dict(pp=4, sdp=2), dict(
        microbatches=4, pipeline="interleaved", pipeline_head="spread",
        pipeline_partition=(2, 3, 3, 2)), False),
    "dp2-pp2-sdp2-1f1b-spread-auto": ("l10", 32, dict(dp=2, pp=2, sdp=2), dict(
        microbatches=4, pipeline="interleaved", pipeline_head="spread",
        pipeline_partition="auto"), False),
    # context parallelism
    "cp4-sdp2-ring": ("l4", 16, dict(cp=4, sdp=2), dict(context_parallel="ring"), True),
    "cp4-sdp2-ulysses": ("l4", 16, dict(cp=4, sdp=2), dict(context_parallel="ulysses"), False),
    "cp2-tp2-sdp2-ring-remat": ("l4", 16, dict(cp=2, tp=2, sdp=2), dict(
        context_parallel="ring", remat="full"), False),
    "cp8-ring": ("l4", 16, dict(cp=8), dict(context_parallel="ring"), False),
    # fp8 (the reference runs in fp8 too)
    "sdp4-tp2-fp8": ("l4", 16, dict(sdp=4, tp=2), dict(precision="fp8"), True),
    "pp2-sdp4-1f1b-fp8-vocab": ("l4", 16, dict(pp=2, sdp=4), dict(
        microbatches=4, pipeline="interleaved", precision="fp8", fp8_vocab=True), False),
}
_FP8 = ("precision", "fp8_vocab")  # options that change the single-device numerics


def _params(case):
    return [pytest.param(name, id=name, marks=[] if case[name][4] else [SLOW])
            for name in case]


@functools.cache
def _config(model: str):
    layers = {"l4": 4, "l10": 10}[model]
    return jaxsmp.models.preset("gpt_neox", "tiny", num_hidden_layers=layers,
                                attention_impl="reference")


@functools.cache
def _tokens(rows: int) -> np.ndarray:
    return np.random.default_rng(rows).integers(0, 256, (rows, 32)).astype(np.int32)


def _numerics(options: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in options.items() if k in _FP8))


@functools.cache
def _reference(model: str, rows: int, numerics: tuple):
    """(one SGD step's update / lr and metrics, three AdamW steps) on one device."""
    config, tokens, options = _config(model), _tokens(rows), dict(numerics)
    return (sgd_update(config, single_device_mesh(), tokens, **options),
            train(config, single_device_mesh(), tokens, **options))


def _adamw_params(state) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(trainable(state.params))]


@pytest.mark.parametrize("name", _params(CASES))
def test_full_step_matches_single_device(name):
    model, rows, degrees, options, _ = CASES[name]
    config, tokens, mesh = _config(model), _tokens(rows), jaxsmp.Mesh(**degrees)
    (want_update, want_metrics), (want_state, want_losses) = _reference(
        model, rows, _numerics(options))
    fp8 = options.get("precision") == "fp8"
    got_update, got_metrics = sgd_update(config, mesh, tokens, **options)
    np.testing.assert_allclose(got_metrics["loss"], want_metrics["loss"],
                               rtol=FP8_LOSS_RTOL if fp8 else 1e-5)
    if fp8:  # float8 roundings that flip: no element-wise comparison
        np.testing.assert_allclose(got_metrics["grad_norm"], want_metrics["grad_norm"],
                                   rtol=FP8_NORM_RTOL)
    else:
        assert_gradients_match((got_update, got_metrics), (want_update, want_metrics))
    state, losses = train(config, jaxsmp.Mesh(**degrees), tokens, **options)
    np.testing.assert_allclose(losses, want_losses, rtol=FP8_LOSS_RTOL if fp8 else 1e-5)
    assert losses[-1] < losses[0]
    if not fp8:
        for a, b in zip(_adamw_params(state), _adamw_params(want_state)):
            np.testing.assert_allclose(a, b, atol=ADAMW_ATOL)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _scale_gradient(x, factor):
    return x


_scale_gradient.defvjp(lambda x, factor: (x, None), lambda factor, _, g: (g * factor,))


def test_the_update_check_sees_a_gradient_off_by_a_few_parts_in_ten_thousand():
    """The mistake the lr of 1000 is for: every gradient x (1 + 3e-4), loss unchanged."""
    def mutant(model, batch):
        return _scale_gradient(jaxsmp.losses.causal_lm_loss(model, batch), 1 + 3e-4)
    config, tokens, mesh = _config("l4"), _tokens(16), single_device_mesh()
    want = sgd_update(config, mesh, tokens)
    got = sgd_update(config, mesh, tokens, loss=mutant)
    assert got[1]["loss"] == want[1]["loss"]
    with pytest.raises(AssertionError, match="gradient of parameter"):
        assert_gradients_match(got, want)
