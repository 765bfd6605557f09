"""The whole train step compiled by XLA:GPU for 8 GPUs on this CPU host (deviceless,
``jaxsmp.plan.gpu_target``): SPMD partitioning with custom partitioners, Triton
compilation of the Pallas kernels, buffer assignment and ``memory_analysis()``.

Before the per-device attention (``jaxsmp.train.attention``), bf16 with cuDNN attention
failed here on every sharded mesh (an ``AssertionError`` in JAX's cuDNN partitioner on
``sdp=8``, an ``AttributeError`` on ``sdp=4, tp=2``), ``auto`` picked CPU kernels for a
GPU mesh, and the Pallas kernel ran every head on every ``tp`` device. The default
selection compiles a few cases; the matrix (families x kernels x precisions x meshes x
remat) is ``slow``. ``bench/gpu_compile.py`` prints the same cases as a table.
"""
import re
import sys
from pathlib import Path

import pytest

from conftest import require_gpu_compiler

require_gpu_compiler()
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from gpu_compile import compile_case  # noqa: E402

import jaxsmp  # noqa: E402
from jaxsmp.checkpoint import abstract_state  # noqa: E402
from jaxsmp.losses import causal_lm_loss  # noqa: E402
from jaxsmp.plan import gpu_target  # noqa: E402


def assert_kernels(result: dict, attention: str) -> None:
    kernels = result["kernels"]
    if attention == "cudnn":  # forward and backward fMHA, no Triton attention
        assert kernels["cudnn"] >= 2 and kernels["triton"] == 0, result
    else:
        assert kernels["triton"] >= 3 and kernels["cudnn"] == 0, result  # fwd, dq, dk/dv


@pytest.mark.slow
def test_the_norms_keep_no_float32_intermediates_in_the_compiled_step(monkeypatch):
    """Llama 2 7b width (4 layers, 4 x 2048 tokens per GPU, sdp=8, no remat) compiled for
    8 x H100: with jaxsmp.nn.norm's norms (input and statistics kept) the step needs at
    least 15% fewer temporaries than with the same norms autodiffed whole, which keep
    their float32 intermediates (measured: 0.79 of it at 4 layers, 0.76 at 8)."""
    from jaxsmp.nn import norm
    ours = compile_case("llama", "cudnn", "bf16", "sdp=8", "none", batch=32, layers=4)
    monkeypatch.setattr(norm, "rms_norm", norm.rms_norm_reference)
    plain = compile_case("llama", "cudnn", "bf16", "sdp=8", "none", batch=32, layers=4)
    assert ours["temporaries_mib"] < 0.85 * plain["temporaries_mib"], (ours, plain)


@pytest.mark.slow
@pytest.mark.parametrize("family, bound", [("gpt_neox", 0.6), ("llama", 0.97)])
def test_the_loss_keeps_no_float32_logits_in_the_compiled_step(family, bound, monkeypatch):
    """2 layers of GPT-NeoX 125m (50k vocabulary) and Llama 2 7b (32k) width, 4 x 2048
    tokens per GPU, sdp=8, remat full, compiled for 8 x H100: with jaxsmp.losses'
    cross-entropy on the bf16 logits the step needs fewer temporaries than with the loss
    autodiffed on the model's float32 logits (measured: 1,307 against 2,760 MiB, 0.47x;
    3,086 against 3,330 MiB, 0.93x)."""
    import gpu_compile

    from jaxsmp.losses import next_token_loss_reference
    ours = compile_case(family, "cudnn", "bf16", "sdp=8", "full", batch=32)
    monkeypatch.setattr(gpu_compile, "causal_lm_loss", lambda model, batch: (
        next_token_loss_reference(model(batch["tokens"]), batch["tokens"])))
    plain = compile_case(family, "cudnn", "bf16", "sdp=8", "full", batch=32)
    assert ours["temporaries_mib"] < bound * plain["temporaries_mib"], (ours, plain)


@pytest.mark.parametrize("mesh", ["sdp=8", "sdp=4,tp=2"])
def test_bf16_cudnn_attention_compiles_for_h100_on_sharded_meshes(mesh):
    result = compile_case("gpt_neox", "cudnn", "bf16", mesh, remat="full")
    assert_kernels(result, "cudnn")
    assert 0 < result["temporaries_mib"] < 80 * 1024


def _compiled_text(config, degrees: dict, gpu: str = "H100-SXM", **options) -> str:
    mesh = jaxsmp.Mesh(**degrees, devices=gpu_target.topology(gpu))
    state = abstract_state(config.build, optax.adamw(1e-4), mesh)
    batch = {"tokens": jax.ShapeDtypeStruct((8, 256), np.int32)}
    step = jaxsmp.step(causal_lm_loss, **options)
    return gpu_target.compile_step(step, state, batch, mesh).as_text()


@pytest.mark.parametrize("precision, kernel", [("bf16", "__cudnn$fmha"),
                                               ("fp32", "__gpu$xla.gpu.triton")])
def test_auto_attention_decides_by_the_mesh_devices_not_the_default_backend(precision, kernel):
    assert jax.default_backend() == "cpu"
    config = jaxsmp.models.preset("gpt_neox", "tiny", num_hidden_layers=1)
    assert config.attention_impl == "auto"
    text = _compiled_text(config, dict(sdp=8), precision=precision)
    assert kernel in text


def test_pallas_kernel_runs_on_each_devices_heads_under_tp():
    # 4 heads over tp=2: each device's Triton forward writes [local batch 2, seq, 2, d];
    # partitioned by GSPMD instead, every device ran all 4 heads
    config = jaxsmp.models.preset("gpt_neox", "tiny", num_hidden_layers=1,
                                  attention_impl="pallas")
    text = _compiled_text(config, dict(sdp=4, tp=2), precision="fp32")
    shapes = re.findall(r"= \(f32\[([\d,]+)\][^)]*\) custom-call\([^)]*\), "
                        r'custom_call_target="__gpu\$xla.gpu.triton"', text)
    assert shapes and all(s.split(",")[2] == "2" for s in shapes), shapes


def test_attention_compiles_for_a100_too():
    config = jaxsmp.models.preset("gpt_neox", "tiny", num_hidden_layers=1)
    text = _compiled_text(config, dict(sdp=4, tp=2), gpu="A100-40GB", precision="bf16")
    assert "__cudnn$fmha" in text


@pytest.mark.parametrize("gpu", ["H100-SXM", "A100-40GB"])
@pytest.mark.parametrize("dtype, head_dim", [("bfloat16", 64), ("bfloat16", 128),
                                             ("bfloat16", 256), ("float32", 256)])
def test_each_pallas_launch_compiles_for_the_gpu(gpu, dtype, head_dim, triton_target_gpu):
    """Each entry of ``pallas_kernels.flash_tuning.LAUNCH`` (tiles, warps, stages) fits
    the GPU's shared memory: Triton compiles the forward, dq and dk/dv kernels. Before
    float32 at head dim 256 had its own entry it asked for 256 KiB on H100 (227 there)."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from pallas_kernels.attention import attention
    mesh = Mesh(np.array(gpu_target.topology(gpu, gpus_per_host=1)), ("x",))
    shape = jax.ShapeDtypeStruct((1, 1024, 2, head_dim), np.dtype(jax.numpy.dtype(dtype)),
                                 sharding=NamedSharding(mesh, PartitionSpec()))

    def loss(q, k, v):
        return attention(q, k, v, causal=True, impl="pallas").astype(np.float32).sum()
    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(shape, shape, shape).compile(
    ).as_text()
    assert text.count('custom_call_target="__gpu$xla.gpu.triton"') == 3


def test_a_gpu_name_without_a_target_is_refused():
    with pytest.raises(ValueError, match="no GPU target for 'V100'.*valid"):
        gpu_target.topology("V100")


FAMILY_KERNELS = [  # family, attention, precision, mesh, remat: each family x kernel x dtype
    ("gpt_neox", "cudnn", "bf16", "sdp=8", "none"),
    ("gpt_neox", "cudnn", "fp16", "tp=8", "full"),
    ("gpt_neox", "pallas", "bf16", "dp=2,sdp=4", "full"),
    ("gpt_neox", "pallas", "fp32", "pp=2,sdp=4", "none"),
    ("gpt_neox", "auto", "fp16", "sdp=4,tp=2", "offload"),
    ("bloom", "pallas", "bf16", "sdp=4,tp=2", "full"),
    ("bloom", "auto", "fp16", "pp=2,sdp=4", "full"),
    ("bloom", "auto", "fp32", "tp=8", "none"),
    ("llama", "cudnn", "bf16", "pp=2,sdp=4", "offload"),
    ("llama", "cudnn", "fp16", "dp=2,sdp=4", "full"),
    ("llama", "pallas", "fp32", "sdp=8", "full"),
    ("llama", "auto", "bf16", "tp=8", "full"),
]


@pytest.mark.slow
@pytest.mark.parametrize("family, attention, precision, mesh, remat", FAMILY_KERNELS)
def test_train_step_compiles_for_h100(family, attention, precision, mesh, remat):
    result = compile_case(family, attention, precision, mesh, remat)
    expected = attention if attention != "auto" else (
        "pallas" if family == "bloom" or precision == "fp32" else "cudnn")
    assert_kernels(result, expected)


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["sdp=4,tp=2", "tp=8"])
def test_sequence_parallel_compiles_with_cudnn(mesh):
    result = compile_case("gpt_neox", "cudnn", "bf16", mesh, "full", sequence_parallel=True)
    assert_kernels(result, "cudnn")


def test_pipeline_with_tp_refuses_a_per_device_kernel_and_auto_runs_blockwise():
    config = jaxsmp.models.preset("gpt_neox", "tiny", num_hidden_layers=2)
    with pytest.raises(ValueError, match="pipeline and tensor parallelism together"):
        _compiled_text(config.replace(attention_impl="cudnn"), dict(pp=2, sdp=2, tp=2),
                       precision="bf16", microbatches=2)
    text = _compiled_text(config, dict(pp=2, sdp=2, tp=2), precision="bf16", microbatches=2)
    assert "__cudnn$fmha" not in text and "xla.gpu.triton" not in text


@pytest.fixture(scope="module")
def offload_pair() -> tuple[dict, dict]:
    # Llama 2 7b width, 8 layers, 4 x 2048 tokens per GPU: saved matmul outputs dominate
    # (with 2 layers and one sequence the gathered weights do, and the staging buffers of
    # the host copies outweigh what is moved)
    return tuple(compile_case("llama", "cudnn", "bf16", "sdp=8", remat, batch=32, layers=8)
                 for remat in ("save_matmuls", "offload"))


def test_offload_keeps_saved_matmuls_in_host_memory_on_the_gpu(offload_pair):
    saved, offload = offload_pair
    assert saved["host_buffers"] == 0 and offload["host_buffers"] > 0
    assert offload["host_temporaries_mib"] > 1024  # measured 4,032 MiB


def test_offload_lowers_device_temporaries_by_what_it_moves_to_the_host(offload_pair):
    # measured: 8,725 -> 5,164 MiB on the device, 4,032 MiB on the host (the scan's
    # backward reads each layer's slice back from host memory: zero3_scan keeps it)
    saved, offload = offload_pair
    drop = saved["temporaries_mib"] - offload["temporaries_mib"]
    assert drop > 0.75 * offload["host_temporaries_mib"], (saved, offload)


def test_save_qkv_keeps_the_q_k_v_projections_on_the_gpu():
    """remat="save_qkv" compiled for 8 x H100 (Llama 2 7b width, 8 kv heads, 8 layers,
    4 x 2048 tokens per GPU): cuDNN's attention, and the q, k, v outputs kept across the
    step. Measured: 4,270 -> 5,070 MiB of temporaries, 801 against 768 MiB of q, k, v
    (4,613 -> 5,181 while the loss kept float32 logits, which set remat full's peak;
    the peaks fall at different moments: the layer backward recomputes less)."""
    full, kept = (compile_case("llama", "cudnn", "bf16", "sdp=8", remat, batch=32, layers=8)
                  for remat in ("full", "save_qkv"))
    assert_kernels(kept, "cudnn")
    qkv_mib = 8 * (4 * 2048) * (4096 + 2 * 1024) * 2 / 2**20     # layers x tokens x widths
    grown = kept["temporaries_mib"] - full["temporaries_mib"]
    assert 0.5 * qkv_mib < grown <= 1.1 * qkv_mib, (full, kept)


@pytest.mark.slow
@pytest.mark.parametrize("mesh, strategy, kernel", [
    ("cp=8", "auto", "cudnn"),        # 32 heads over cp=8: ulysses, cuDNN on whole sequences
    ("cp=4,tp=2", "auto", "cudnn"),   # 16 heads per tp device over cp=4
    ("cp=8", "ring", None)])          # ring: blocks in XLA, no attention kernel
def test_32k_tokens_compile_for_h100_with_context_parallelism(mesh, strategy, kernel):
    # Llama 2 7b layers (grouped to 8 kv heads), one sequence of 32,768 tokens on 8 GPUs
    result = compile_case("llama", "auto", "bf16", mesh, "full", batch=1, seq=32768,
                          context_parallel=strategy)
    if kernel:
        assert_kernels(result, kernel)
    else:
        assert result["kernels"] == {"cudnn": 0, "triton": 0}, result
    assert 0 < result["temporaries_mib"] < 40 * 1024, result


@pytest.mark.slow
@pytest.mark.parametrize("degrees, options", [
    (dict(pp=2, sdp=2, tp=2), dict(pipeline_head="last")),
    (dict(pp=2, sdp=2, tp=2), dict(pipeline_head="spread")),
    (dict(pp=2, sdp=4), dict(pipeline_head="spread", precision="fp8")),
], ids=["tp-fused-last", "tp-fused-spread", "fp8-spread"])
def test_1f1b_variants_compile_for_h100(degrees, options):
    """1F1B's fused ticks (under tp), the spread head and fp8 on 1F1B, compiled by
    XLA:GPU: the ticks' transfers are collective-permutes, the spread head's psums
    all-reduces, and fp8's matmuls cuBLASLt FP8 GEMMs."""
    config = jaxsmp.models.preset("gpt_neox", "tiny", num_hidden_layers=4)
    options = {"precision": "bf16", **options}
    mesh = jaxsmp.Mesh(**degrees, devices=gpu_target.topology("H100-SXM"))
    state = abstract_state(config.build, optax.adamw(1e-4), mesh)
    batch = {"tokens": jax.ShapeDtypeStruct((16, 128), np.int32)}  # pp divides microbatches
    step = jaxsmp.step(causal_lm_loss, microbatches=2, pipeline="interleaved", **options)
    text = gpu_target.compile_step(step, state, batch, mesh).as_text()
    assert "collective-permute" in text and "all-reduce" in text
    if options["precision"] == "fp8":
        assert gpu_target.count_fp8_gemms(text) > 0


@pytest.mark.slow
def test_virtual_keeps_no_weight_copy_per_tick_on_h100():
    """The virtual schedule compiled by XLA:GPU: its temporaries stay within 10% of
    simple's where the weights dominate them (16 microbatches of one sequence per
    device): measured 238.8 vs 250.2 MiB; keeping each tick's chunk slice (before
    jaxsmp.pipeline.chunk) made them 443.5 MiB."""
    config = jaxsmp.models.preset("gpt_neox", "tiny", num_hidden_layers=8, hidden_size=512,
                                  intermediate_size=2048)
    mesh = jaxsmp.Mesh(pp=4, sdp=2, devices=gpu_target.topology("H100-SXM"))
    state = abstract_state(config.build, optax.adamw(1e-4), mesh)
    batch = {"tokens": jax.ShapeDtypeStruct((32, 128), np.int32)}
    temp = {}
    for schedule in ("simple", "virtual"):
        step = jaxsmp.step(causal_lm_loss, microbatches=16, pipeline=schedule,
                           virtual_chunks=2, pipeline_partition="equal")
        compiled = gpu_target.compile_step(step, state, batch, mesh)
        temp[schedule] = compiled.memory_analysis().temp_size_in_bytes / 2 ** 20
    assert temp["virtual"] < 1.1 * temp["simple"], temp
