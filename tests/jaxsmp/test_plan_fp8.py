"""The planner's precision="fp8": float8 Linears at the FP8 peak, the amax histories in
memory, refused on GPUs without FP8 tensor cores, compiled to FP8 GEMMs by the pre-flight."""
import pytest

import jaxsmp
from conftest import require_gpu_compiler
from jaxsmp.plan import Candidate, cluster, plan
from jaxsmp.plan.hardware import GPUS
from jaxsmp.plan.hlo_cost import Rates, estimate
from jaxsmp.plan.memory import AMAX_BYTES_PER_LINEAR, estimate_memory
from jaxsmp.plan.search import candidates, evaluate
from jaxsmp.plan.throughput import estimate_time
from jaxsmp.plan.workload import Workload

LLAMA = jaxsmp.models.preset("llama", "tiny", num_hidden_layers=4)


@pytest.fixture(scope="module")
def llama():
    return Workload(LLAMA, 128)


def test_the_amax_histories_are_state_replicated_over_sdp_and_tp_and_split_over_pp(llama):
    assert AMAX_BYTES_PER_LINEAR == 3 * 1024 * 4
    assert llama.fp8_linears == (7, 0)        # q, k, v, o, gate, up, down; the head is bf16
    for (sdp, tp, pp), layers in [((8, 1, 1), 4), ((4, 2, 1), 4), ((4, 1, 2), 2)]:
        # fp8 reduces gradients in float32 by default: bf16 compared at the same
        fp8, bf16 = (estimate_memory(llama, Candidate(1, sdp, tp, pp, 1, 2, precision=p,
                                                      reduce_dtype="fp32"))
                     for p in ("fp8", "bf16"))
        assert fp8.amax == 7 * layers * 12288 and bf16.amax == 0
        assert fp8.state - bf16.state == fp8.amax     # no optimizer state for them
        # weights gathered and temporaries kept as bf16's
        assert fp8.temporaries == bf16.temporaries and fp8.peak - bf16.peak == fp8.amax


def test_the_linears_run_at_twice_bf16s_peak_on_h100_and_the_rest_at_bf16s():
    h100 = GPUS["H100-SXM"]
    assert h100.linear_flops("fp8") == pytest.approx(2 * h100.flops("bf16"), rel=1e-3)
    assert h100.linear_flops("bf16") == h100.flops("bf16")
    assert h100.flops("fp8") == h100.flops("bf16")   # attention, vocabulary projection


def test_an_fp8_step_is_faster_than_bf16_on_h100_by_less_than_its_matmul_share():
    # Llama 2 7b's width (2 layers), 4 x 2048 tokens per GPU: the Linears compute-bound
    w = Workload(jaxsmp.models.preset("llama", "7b", num_hidden_layers=2), 2048)
    target = cluster("p5.48xlarge")
    fp8, bf16 = (estimate_time(w, Candidate(1, 8, 1, 1, 4, 1, "full", p, reduce_dtype="fp32"),
                               target) for p in ("fp8", "bf16"))
    assert fp8.compute < bf16.compute
    assert fp8.compute > bf16.compute / 2          # attention, memory-bound work stay
    assert fp8.sdp == pytest.approx(bf16.sdp)       # weights gathered as bf16


@pytest.mark.parametrize("node", ["p4d.24xlarge", "p4de.24xlarge", "8xA100-80GB+400Gbps"])
def test_fp8_is_refused_on_a100s_naming_the_gpu(node, llama):
    target = cluster(node)
    with pytest.raises(ValueError, match=r"precision 'fp8' needs FP8 tensor cores .*A100"):
        plan(LLAMA, target, seq_len=128, global_batch=8, precision="fp8")
    with pytest.raises(ValueError, match="FP8 tensor cores"):
        evaluate(llama, Candidate(1, 8, 1, 1, 1, 1, precision="fp8"), target)


def test_the_gpu_preflight_refuses_fp8_on_a100_before_compiling(monkeypatch):
    import importlib
    module = importlib.import_module("jaxsmp.plan.gpu_preflight")

    def compile_candidate(*args, **kwargs):
        raise AssertionError("compiled")
    monkeypatch.setattr(module, "compile_candidate", compile_candidate)
    with pytest.raises(ValueError, match="A100-80GB has none; use 'bf16'"):
        module.gpu_preflight(LLAMA, Candidate(1, 8, 1, 1, 1, 1, precision="fp8"), 128,
                             "A100-80GB")


def test_the_cli_plans_fp8_on_h100_and_refuses_it_on_a100_in_one_line(capsys):
    from jaxsmp.plan.__main__ import main
    args = ["--model", "llama:tiny", "--seq-len", "128", "--global-batch", "8", "--top", "1",
            "--precision", "fp8"]
    assert main([*args, "--node", "p5.48xlarge"]) == 0
    assert "llama:tiny: fp8" in capsys.readouterr().out
    assert main([*args, "--node", "p4de.24xlarge"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: precision 'fp8' needs FP8 tensor cores") and err.count("\n") == 1


def test_fp8_plans_consider_every_pipeline_schedule(llama):
    target = cluster("p5.48xlarge")
    schedules = {c.schedule for c in candidates(llama, target, 16, "fp8") if c.pp > 1}
    assert schedules == {"simple", "interleaved", "virtual"}


FP8_MODULE = """HloModule step, entry_computation_layout={()}

ENTRY %main (a: f8e4m3fn[4096,4096], b: f8e4m3fn[4096,4096], s: f32[], t: f32[]) -> bf16[4096,4096] {
  %a = f8e4m3fn[4096,4096]{1,0} parameter(0)
  %b = f8e4m3fn[4096,4096]{1,0} parameter(1)
  %s = f32[] parameter(2)
  %t = f32[] parameter(3)
  ROOT %g = bf16[4096,4096]{1,0} custom-call(%a, %b, %s, %t), custom_call_target="TARGET", backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}
}
"""


def test_an_fp8_gemm_of_the_compiled_program_runs_at_the_fp8_rate():
    rates = Rates(matmul_flops=1e12, attention_flops=5e11, hbm_bytes=1e9, fp8_matmul_flops=2e12)
    fp8 = estimate(FP8_MODULE.replace("TARGET", "__cublas$lt$matmul$f8"), rates)
    bf16 = estimate(FP8_MODULE.replace("TARGET", "__cublas$lt$matmul"), rates)
    assert fp8.matmul_flops == bf16.matmul_flops == 2 * 4096 ** 3
    assert fp8.matmul == pytest.approx(bf16.matmul / 2)


@pytest.mark.slow
def test_the_gpu_preflight_compiles_fp8_to_fp8_gemms_and_counts_them():
    require_gpu_compiler()
    from jaxsmp.plan import gpu_preflight
    config = LLAMA.replace(num_hidden_layers=3, attention_impl="cudnn")
    result = gpu_preflight(config, Candidate(1, 8, 1, 1, 1, 1, "none", "fp8"), 256,
                           "H100-SXM", cluster=cluster("p5.48xlarge"))
    # a forward loop of one GEMM per Linear and a backward one of two (and a peeled layer)
    assert result.fp8_gemms >= 3 * 7 and result.fp8_gemms % 7 == 0, result.fp8_gemms
    assert f"fp8: {result.fp8_gemms} cuBLASLt FP8 GEMM calls" in result.summary()
    assert result.compiled.arguments == pytest.approx(result.predicted.arguments, rel=0.05)
