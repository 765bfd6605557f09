"""Compiling for NVIDIA GPUs on a host without one: XLA:GPU, deviceless.

With ``jax-cuda12-plugin`` of the installed jaxlib's version (the ``cuda12`` extra;
the CUDA 13 plugin has not been tried without a GPU) (no GPU, driver or CUDA wheels
needed) and ``JAX_PLATFORMS=cpu``, JAX describes a GPU topology from a target
config (``targets/*.txtpb``: XLA's ``GpuTargetConfigProto`` for each GPU of the
planner's node table) and ``.lower(...).compile()`` runs XLA's GPU compiler for real:
SPMD partitioning (custom partitioners included), fusion, Triton compilation of the
Pallas kernels, buffer assignment and ``memory_analysis()``. It does no autotuning and
skips cuDNN's own graph checks (both need a device): it proves that a step compiles and
what memory it needs, not how fast it runs.

    devices = gpu_target.topology("H100-SXM", gpus_per_host=8)
    mesh = jaxsmp.Mesh(sdp=4, tp=2, devices=devices)
    compiled = gpu_target.compile_step(step, state, batch, mesh)   # abstract state, batch

A GPU run compiles against its allocator's limit (``XLA_PYTHON_CLIENT_MEM_FRACTION`` of
the GPU, :func:`jaxsmp.xla_flags.mem_fraction`), a deviceless compile against 80% of the
target's memory; :func:`compile_step` sets XLA's slop factor so that both plan the step's
temporaries within the same limit (:func:`memory_limit_options`).

Two questions JAX asks the local machine while tracing get the target's answer inside
:func:`compiling_for`: the cuDNN version and compute capability (cuDNN attention), and
from JAX 0.11 on the Triton target GPU (Pallas), which the abstract mesh answers.
"""
from __future__ import annotations

import collections
import contextlib
import re
from collections.abc import Iterator
from importlib import resources
from typing import Any

import jax
import numpy as np

from jaxsmp import xla_flags
from jaxsmp.checks import positive_int

# The CUDA runtime the compiles assume (the configs describe devices, not toolkits):
# without one XLA takes it to be 0.0.0, and its GEMM rewriter emits FP8 cuBLASLt GEMMs
# only from CUDA 12 on.
CUDA_RUNTIME = "runtime_version { major: 12 minor: 8 }"
# precision="fp8" steps compile with jaxsmp.train.precision.FP8_COMPILER_OPTIONS, which
# make their float8 matmuls these cuBLASLt calls
FP8_GEMM = "__cublas$lt$matmul$f8"
TARGETS = {"A100-40GB": "a100_sxm_40", "A100-80GB": "a100_sxm_80", "H100-SXM": "h100_sxm",
           "H200": "h200"}  # keys: jaxsmp.plan.hardware.GPUS


def target_config(gpu: str) -> str:
    """The text ``GpuTargetConfigProto`` of ``gpu`` (a key of :data:`TARGETS`)."""
    if gpu not in TARGETS:
        raise ValueError(f"no GPU target for {gpu!r}; valid: {sorted(TARGETS)}")
    return resources.files("jaxsmp.plan").joinpath(f"targets/{TARGETS[gpu]}.txtpb").read_text()


def _version(text: str, field: str) -> tuple[int, int]:
    found = re.search(field + r"\s*\{\s*major:\s*(\d+)(?:\s*minor:\s*(\d+))?", text)
    if not found:
        raise ValueError(f"target config has no {field}")
    return int(found.group(1)), int(found.group(2) or 0)


def topology(gpu: str = "H100-SXM", gpus_per_host: int = 8, hosts: int = 1,
             slices: int = 1) -> list:
    """Abstract devices of ``slices x hosts x gpus_per_host`` GPUs of type ``gpu``, for
    ``jaxsmp.Mesh(..., devices=...)``; nothing is allocated on them."""
    from jax.experimental import topologies
    for name, value in (("gpus_per_host", gpus_per_host), ("hosts", hosts), ("slices", slices)):
        positive_int(name, value)
    try:
        topo = topologies.get_topology_desc(
            platform="cuda", topology=f"{slices}x{hosts}x{gpus_per_host}",
            target_config=target_config(gpu) + "\n" + CUDA_RUNTIME + "\n")
    except (RuntimeError, ImportError, jax.errors.JaxRuntimeError) as e:
        raise RuntimeError(
            f"compiling for GPUs on this host needs the CUDA plugin of the installed jaxlib "
            f"(pip install 'jax-cuda12-plugin=={jax.lib.__version__}'): {e}") from e
    return list(topo.devices)


@contextlib.contextmanager
def compiling_for(gpu: str) -> Iterator[None]:
    """JAX's cuDNN attention asks the local cuDNN and GPU for their versions while
    tracing; inside this context the target's (from its config) answer."""
    from jax._src.cudnn import fused_attention_stablehlo as cudnn
    text = target_config(gpu)
    dnn, capability = _version(text, "dnn_version_info"), _version(text, "cuda_compute_capability")
    saved = cudnn.check_cudnn_version, cudnn.check_compute_capability
    cudnn.check_cudnn_version = lambda: dnn[0] * 10000 + dnn[1] * 100
    cudnn.check_compute_capability = lambda want: capability >= tuple(
        int(x) for x in want.split("."))
    try:
        yield
    finally:
        cudnn.check_cudnn_version, cudnn.check_compute_capability = saved


def gpu_of(mesh: Any) -> str:
    """The :data:`TARGETS` key of the GPU a ``jaxsmp.Mesh``, JAX mesh or list of
    :func:`topology` devices is on."""
    devices = getattr(getattr(mesh, "jax_mesh", mesh), "devices", mesh)
    kind = np.asarray(devices).flat[0].device_kind
    for gpu in TARGETS:
        if _description(gpu) == kind:
            return gpu
    raise ValueError(f"mesh devices are {kind!r}, not a GPU target; valid: "
                     f"{[_description(g) for g in TARGETS]}")


def _description(gpu: str) -> str:
    return re.search(r'device_description_str:\s*"([^"]+)"', target_config(gpu)).group(1)


def count_fp8_gemms(hlo_text: str) -> int:
    """cuBLASLt FP8 GEMM calls in a compiled program's text."""
    return len(re.findall(r'custom_call_target="' + re.escape(FP8_GEMM) + '"', hlo_text))


def gemms_per_computation(hlo_text: str) -> list[collections.Counter]:
    """For each computation of a compiled program's text that calls cuBLAS (a loop
    body, the entry), how many calls of each GEMM target it makes."""
    bodies = re.findall(r"^(?:ENTRY )?%?[\w.\-]+ [^\n]*\{\n(.*?)\n\}", hlo_text, re.S | re.M)
    found = (collections.Counter(re.findall(r'custom_call_target="(__cublas[^"]*)"', b))
             for b in bodies)
    return [c for c in found if c]


def device_memory(gpu: str) -> int:
    """The memory of ``gpu`` in its target config, in bytes."""
    return int(re.search(r"device_memory_size:\s*(\d+)", target_config(gpu)).group(1))


def argument_bytes(*trees: Any) -> int:
    """Per-device bytes of the (abstract) arrays in ``trees``: their shards where they
    carry a sharding, else whole."""
    total = 0
    for leaf in jax.tree.leaves(trees):
        sharding = getattr(leaf, "sharding", None)
        shape = sharding.shard_shape(leaf.shape) if sharding is not None else leaf.shape
        total += int(np.prod(shape)) * np.dtype(leaf.dtype).itemsize
    return total


def memory_limit_options(gpu: str, arguments: int) -> dict:
    """XLA's slop factor for a deviceless compile of a step with ``arguments`` bytes per
    device, so that it plans the temporaries within the limit a run on ``gpu`` gives
    them (:func:`jaxsmp.plan.memory.temporaries_limit` of the planner's capacity), where
    deviceless XLA takes 80% of the memory as its base instead of the allocator's.
    ``{}`` if the arguments alone exceed either."""
    from jaxsmp.plan.memory import capacity, temporaries_limit
    memory = device_memory(gpu)
    run = temporaries_limit(capacity(memory), arguments)
    deviceless = xla_flags.DEVICELESS_BASE * memory - arguments
    if deviceless <= 0 or run <= 0:
        return {}
    return {"xla_gpu_memory_limit_slop_factor": round(100 * run / deviceless)}


def compile_step(step: Any, state: Any, batch: Any, mesh: Any,
                 compiler_options: dict | None = None):
    """``step`` (a ``jaxsmp.step``) compiled by XLA:GPU for ``mesh`` (a ``jaxsmp.Mesh``
    of :func:`topology` devices) from abstract ``state`` and ``batch``, as calling it
    compiles it (with its precision's XLA options, and XLA's memory limit as a run has
    it: :func:`memory_limit_options`); ``compiler_options``: more, on top of the step's
    own, for a comparison (bf16 compiled as fp8 is, say)."""
    gpu = gpu_of(mesh)
    options = {**memory_limit_options(gpu, argument_bytes(state, batch)),
               **(compiler_options or {})}
    with compiling_for(gpu), jax.set_mesh(mesh.jax_mesh):
        return step.lower(state, batch).compile(options)
