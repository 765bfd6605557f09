"""The compiled step's time (roofline over XLA:GPU's program) against the analytic model
the search uses, on a shape the calibration did not compile."""
import pytest

from conftest import require_gpu_compiler

require_gpu_compiler()

import jaxsmp  # noqa: E402
from jaxsmp.plan import Candidate, Workload, cluster, estimate_time  # noqa: E402
from jaxsmp.plan.compiled import compile_candidate  # noqa: E402
from jaxsmp.plan.compiled_time import compiled_time  # noqa: E402
from jaxsmp.plan.gpu_preflight import _topology  # noqa: E402
from jaxsmp.plan.throughput import memory_bound  # noqa: E402


def _compiled():
    # Llama 2 7b's width, 6 layers, sdp=8 on 8 A100-80GB, 2 x 4096 tokens per GPU: not a
    # shape the calibration compiled (2048 tokens, 4 and 8 layers)
    config = jaxsmp.models.preset("llama", "7b", num_hidden_layers=6)
    c = Candidate(1, 8, 1, 1, 1, 2, "full", "bf16")
    target = cluster("p4de.24xlarge", 1)
    compiled = compile_candidate(config, c, 4096, _topology("A100-80GB", 8))
    return Workload(config, 4096), c, target, compiled_time(compiled, target.node.gpu,
                                                            "bf16", target)


@pytest.mark.slow
def test_the_analytic_compute_time_is_within_15_percent_of_the_compiled_programs():
    w, c, target, timed = _compiled()
    tokens = c.global_batch * 4096 / 8
    matmuls = 6 * (w.layers * w.layer_matmul_params + w.hidden * w.vocab) * tokens
    # every loop body counted per trip: the forward is recomputed (but not its last matmuls)
    assert matmuls < timed.kernels.matmul_flops < matmuls * 4 / 3
    step = estimate_time(w, c, target)
    assert step.compute + step.optimizer == pytest.approx(timed.kernels.compute, rel=0.15)
    assert "analytic model" in timed.summary(step)


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=(
    "the memory scales were fitted before hlo_cost stopped pricing reduce-scatter-done as "
    "a memory kernel and before the leaner step: analytic 0.091 s against the compiled "
    "0.056 s; refitting them (python -m jaxsmp.plan.calibrate) made the held-out "
    "published runs worse, so it waits for the planner's recalibration"))
def test_the_calibrated_memory_bound_time_is_within_20_percent_of_the_compiled_programs():
    w, c, target, timed = _compiled()
    scale, parts = w.memory_scale, memory_bound(w, c, target)
    analytic = scale.layer * parts[0] + scale.weights * parts[1] + scale.outside * parts[2]
    assert analytic == pytest.approx(timed.kernels.memory + timed.kernels.launch, rel=0.2)
