"""``step.explain(state, batch)`` names what the step runs, and the program agrees.

The attention kernel it names is checked against the custom calls of the program the
step lowers (default selection) and compiles (``slow``) for a deviceless H100: cuDNN's
``__cudnn$fmha``, the Pallas kernel's Triton call, neither for ``blockwise`` (``auto``
on ``pp > 1`` with ``tp > 1``). Context parallelism's strategy is checked against the
lowered CPU program: ring's ``collective_permute``, which Ulysses has not.
"""
import contextlib

import jax
import numpy as np
import optax
import pytest

import jaxsmp
from conftest import require_gpu_compiler
from jaxsmp.checkpoint import abstract_state
from jaxsmp.losses import causal_lm_loss

MARKERS = {"cudnn": "__cudnn$fmha", "pallas": "__gpu$xla.gpu.triton"}
GPU_CASES = [  # mesh, options, the kernel auto runs
    (dict(sdp=8), dict(precision="bf16"), "cudnn"),
    (dict(sdp=8), dict(precision="fp32"), "pallas"),
    (dict(pp=2, sdp=2, tp=2), dict(precision="bf16", microbatches=2), "blockwise"),
]


def _setup(degrees: dict, devices=None, layers: int = 2, batch=(8, 256), **options):
    config = jaxsmp.models.preset("gpt_neox", "tiny", num_hidden_layers=layers)
    mesh = jaxsmp.Mesh(**degrees, devices=devices)
    state = abstract_state(config.build, optax.adamw(1e-4), mesh)
    tokens = {"tokens": jax.ShapeDtypeStruct(batch, np.int32)}
    return jaxsmp.step(causal_lm_loss, **options), state, tokens, mesh


def _gpu(degrees: dict, **options):
    """(step, state, batch, context) for a deviceless H100 mesh."""
    require_gpu_compiler()
    from jaxsmp.plan import gpu_target
    step, state, batch, mesh = _setup(degrees, gpu_target.topology("H100-SXM"), **options)
    context = contextlib.ExitStack()
    context.enter_context(gpu_target.compiling_for("H100-SXM"))
    context.enter_context(jax.set_mesh(mesh.jax_mesh))
    return step, state, batch, context


def assert_program_runs(kernels: tuple[str, ...], text: str) -> None:
    """Each kernel with a custom call is in ``text`` exactly when it is named."""
    assert kernels, "explain named no attention kernel"
    for kernel, marker in MARKERS.items():
        assert (marker in text) == (kernel in kernels), (kernel, kernels)


@pytest.mark.parametrize("degrees, options, kernel", GPU_CASES,
                         ids=["cudnn", "pallas", "pp-tp-blockwise"])
def test_the_named_kernel_is_the_one_the_lowered_gpu_program_calls(degrees, options, kernel):
    step, state, batch, context = _gpu(degrees, **options)
    with context:
        explained = step.explain(state, batch)
        text = step.lower(state, batch).as_text()
    assert explained.kernels == (kernel,)
    assert_program_runs(explained.kernels, text)


def test_auto_says_why_it_runs_blockwise_under_a_pipeline_with_tp():
    step, state, batch, context = _gpu(dict(pp=2, sdp=2, tp=2), precision="bf16",
                                       microbatches=2)
    with context:
        attention, = step.explain(state, batch).attention
    assert attention.value == "blockwise" and "pp=2 with tp=2" in attention.why


@pytest.mark.slow
@pytest.mark.parametrize("degrees, options, kernel", [GPU_CASES[0], GPU_CASES[2]],
                         ids=["cudnn", "pp-tp-blockwise"])
def test_the_named_kernel_is_the_one_the_compiled_h100_program_runs(degrees, options, kernel):
    step, state, batch, context = _gpu(degrees, **options)
    with context:
        explained = step.explain(state, batch)
        text = step.lower(state, batch).compile().as_text()
    assert explained.kernels == (kernel,)
    assert_program_runs(explained.kernels, text)


@pytest.mark.parametrize("strategy", ["auto", "ulysses"])
def test_the_named_context_strategy_is_the_one_the_program_runs(strategy):
    step, state, batch, _ = _setup(dict(cp=4, sdp=2), context_parallel=strategy)
    explained = step.explain(state, batch)
    text = step.lower(state, batch).as_text()  # ring passes its blocks on, ulysses not
    assert ("stablehlo.collective_permute" in text) == (explained.context_parallel.value
                                                       == "ring")
    if strategy == "auto":  # 4 heads, cp=4: on CPU ring, its chunk pairs in XLA tiles
        assert explained.context_parallel.value == "ring"
        assert "off GPUs" in explained.context_parallel.why
        assert explained.kernels == ("blockwise",) and "ring" in explained.attention[0].why
    else:
        assert explained.context_parallel.value == "ulysses"
        assert explained.context_parallel.why is None  # the user's choice, not auto's
        assert explained.kernels == ("reference",)


def test_a_cpu_step_explains_every_choice_in_its_text():
    step, state, batch, _ = _setup(dict(sdp=4, tp=2), precision="bf16", remat="full")
    explained = step.explain(state, batch)
    assert explained.kernels == ("reference",) and "fits 32 MiB" in explained.attention[0].why
    assert explained.collectives.value == "all_gather xla; reduce_scatter xla"
    assert "mesh.collectives='auto'" in explained.collectives.why
    assert explained.remat.value == "full" and explained.remat.why is None
    assert explained.prefetch.value == "off" and explained.fp8_gemms == ()
    lines = str(explained).splitlines()
    assert [line.split("  ")[0] for line in lines] == [
        "attention", "context parallel", "pipeline", "pipeline head", "collectives",
        "precision", "remat", "prefetch", "batch gathers"]
    assert lines[0].startswith("attention         reference (auto: cpu: one float32 score")


def test_collectives_set_by_the_step_are_named_without_a_reason():
    step, state, batch, _ = _setup(dict(sdp=8), collectives="ring")
    assert str(step.explain(state, batch).collectives) == "ring (set by the step's collectives)"


def test_fp8_names_its_float8_gemms_and_the_vocabulary_projection():
    step, state, batch, _ = _setup(dict(sdp=8), precision="fp8", fp8_vocab=True)
    explained = step.explain(state, batch)
    assert len(explained.fp8_gemms) == 5, explained.fp8_gemms  # 4 per layer, embed_out
    assert any("embed_out" in g for g in explained.fp8_gemms)
    assert "vocabulary projection in float8" in explained.precision.value


def test_the_pipeline_split_and_head_come_from_the_steps_own_costing():
    step, state, batch, _ = _setup(dict(pp=2, sdp=4), layers=4, batch=(16, 64),
                                   microbatches=2, pipeline="interleaved")
    explained = step.explain(state, batch)
    split = step.pipeline_partition(state, batch)
    want = split if split == "equal" else "layers " + ", ".join(map(str, split))
    assert explained.pipeline.value == f"interleaved, 2 stages, {want}"
    assert "compiled costs" in explained.pipeline.why
    head = step.pipeline_head(state, batch)
    assert explained.pipeline_head.value.startswith("spread" if head == "spread" else "the last")
    assert explained.pipeline_head.why


def test_an_eval_step_explains_itself_too():
    _, state, batch, _ = _setup(dict(sdp=8))
    explained = jaxsmp.eval_step(causal_lm_loss).explain(state, batch)
    assert explained.kernels == ("reference",) and explained.pipeline.value == "none (pp=1)"
