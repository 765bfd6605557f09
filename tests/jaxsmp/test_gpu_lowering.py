"""The whole train step lowers for CUDA on this CPU host, with the attention kernel
``attention_impl="auto"`` would run on a GPU, at GPU-realistic shapes (sequence 2048,
the presets' head dims 64/80/96/128), from abstract arrays (nothing is allocated).

Lowering catches tracing errors, not Triton or cuDNN compile errors. JAX's cuDNN
attention asks the installed cuDNN and GPU for their versions while tracing; on this
host the test stands in cuDNN 9.10 on a Hopper GPU for those two questions (and, on
JAX 0.11.2 and later, an H100 for the Triton lowering's question about the target GPU:
``triton_target_gpu`` in ``tests/conftest.py``). It is a
``custom_partitioning`` op (its Shardy rule splits batch and heads, so it follows tensor
parallelism): the lowered module holds a ``CustomSPMDPartitioning`` call whose callback,
looked up in JAX's registry, is the cuDNN forward or backward partitioner.
"""
import re

import jax
import numpy as np
import optax
import pytest
from jax._src import custom_partitioning
from jax._src.cudnn import fused_attention_stablehlo

import jaxsmp
from jaxsmp.checkpoint import abstract_state
from jaxsmp.losses import causal_lm_loss
from pallas_kernels.attention import choose_impl

SEQ = 2048
CASES = [  # family, preset, precision: head dim, ALiBi
    ("gpt_neox", "125m", "bf16"),   # 64
    ("gpt_neox", "2.7b", "bf16"),   # 80
    ("gpt_neox", "20b", "fp32"),    # 96: float32 runs the Pallas kernel
    ("llama", "7b", "bf16"),        # 128, grouped-query capable
    ("bloom", "560m", "bf16"),      # 64 with ALiBi: Pallas
]


@pytest.fixture
def gpu_stand_in(monkeypatch, triton_target_gpu):
    monkeypatch.setattr(fused_attention_stablehlo, "check_cudnn_version", lambda: 91000)
    monkeypatch.setattr(fused_attention_stablehlo, "check_compute_capability",
                        lambda capability: True)


def _lower(family: str, name: str, precision: str, sequence_parallel: bool = False):
    config = jaxsmp.models.preset(family, name)
    layers = {"n_layer": 2} if family == "bloom" else {"num_hidden_layers": 2}
    dtype = jax.numpy.bfloat16 if precision == "bf16" else jax.numpy.float32
    impl = choose_impl(dtype, config.head_dim, alibi=family == "bloom", segments=False,
                       platform="cuda")
    config = config.replace(attention_impl=impl, **layers)
    if hasattr(config, "max_position_embeddings"):
        config = config.replace(max_position_embeddings=max(SEQ, config.max_position_embeddings))
    mesh = jaxsmp.Mesh(sdp=4, tp=2)
    state = abstract_state(config.build, optax.adamw(1e-4), mesh)
    batch = {"tokens": jax.ShapeDtypeStruct((8, SEQ), np.int32)}
    step = jaxsmp.step(causal_lm_loss, precision=precision, remat="full",
                       sequence_parallel=sequence_parallel)
    return impl, step.lower(state, batch, platforms=("cuda",))


def _partitioners(lowered, text: str) -> list[str]:
    """The Python partitioner of each ``custom_partitioning`` call in the module."""
    keys = re.findall(r'@CustomSPMDPartitioning\(.*?backend_config = "(\d+)"', text)
    infos = [custom_partitioning._sharding_callbacks[key.encode()] for key in keys]
    return [f"{i.partition.__module__}.{i.partition.__qualname__}" for i in infos]


# and with sequence parallelism, once per attention kernel (cuDNN, Pallas)
SEQUENCE_PARALLEL = [(*c, False) for c in CASES] + [("gpt_neox", "125m", "bf16", True),
                                                     ("gpt_neox", "20b", "fp32", True)]


@pytest.mark.parametrize("family, name, precision, sequence_parallel", SEQUENCE_PARALLEL)
def test_train_step_lowers_for_cuda_with_the_gpu_attention_kernel(gpu_stand_in, family, name,
                                                                  precision, sequence_parallel):
    impl, lowered = _lower(family, name, precision, sequence_parallel)
    text = lowered.as_text()
    calls = re.findall(r"stablehlo\.custom_call @([\w$.]+)", text)
    if impl == "cudnn":  # called per device: no cuDNN partitioner runs
        assert not [p for p in _partitioners(lowered, text) if ".cudnn." in p]
        assert any(c.startswith("__cudnn$fmha") and "Backward" not in c for c in calls), calls
        assert any(c.startswith("__cudnn$fmha") and "Backward" in c for c in calls), calls
        assert "__gpu$xla.gpu.triton" not in calls
    else:
        assert impl == "pallas"
        assert calls.count("__gpu$xla.gpu.triton") >= 3, calls  # forward, dq, dk/dv
        for kernel in ("flash_attention_forward", "flash_attention_dq", "flash_attention_dkv"):
            assert kernel in text
