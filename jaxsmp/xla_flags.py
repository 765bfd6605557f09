"""XLA's collective/compute overlap and memory on GPUs, set for the installed jaxlib.

On import, when a CUDA plugin is installed and JAX's backend has not started, jaxsmp adds
to ``XLA_FLAGS`` the flags below that the user did not set: the latency-hiding scheduler
(so the step's prefetched all-gathers and delayed reduce-scatters run beside compute),
pipelined all-gather / reduce-scatter / all-reduce across the layer loop, while-loop double
buffering, two collectives in flight at once (the next layer's gather beside the last
one's reduce-scatter), and combine thresholds of about one layer's parameters. ``jaxsmp.cli`` sizes
the thresholds to the model's layer before it starts the backend.

XLA aborts at start on a flag name it does not know, and names change between releases:
only jaxlib versions in :data:`TESTED` get flags (each set is started in a subprocess by
``tests/jaxsmp/test_xla_flags.py``: 0.10.2 in CI, 0.11.2 and 0.12.0.1 in Python 3.12
venvs as CONTRIBUTING.md says); others get none and a warning. Turn it off with
``JAXSMP_XLA_FLAGS=0``; a flag already in ``XLA_FLAGS`` is left as the user set it.
A one-device step compiles without the loop double buffering (:func:`step_compiler_options`).

Memory: with the flags, jaxsmp lets XLA allocate :data:`MEM_FRACTION` of each GPU
(``XLA_PYTHON_CLIENT_MEM_FRACTION``, JAX's default 0.75, unless the user set it), the
fraction ``jaxsmp.plan`` plans against (:func:`mem_fraction`). JAX compiles against that
allocator limit: XLA keeps a step's temporaries within :data:`XLA_SLOP` of what it leaves
beside the arguments, and above that recomputes (rematerializes) to stay within it.
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, MutableMapping
from importlib.util import find_spec

OPT_OUT = "JAXSMP_XLA_FLAGS"
MEM_FRACTION_VAR = "XLA_PYTHON_CLIENT_MEM_FRACTION"
MEM_FRACTION = 0.95       # of each GPU's memory for XLA's allocator, jaxsmp's default
JAX_MEM_FRACTION = 0.75   # JAX's default, where jaxsmp is opted out
# XLA:GPU's memory limit for a step's temporaries: (allocator limit - arguments) times
# xla_gpu_memory_limit_slop_factor (95) / 100 (gpu_hlo_schedule.cc GetSchedulerMemoryLimit;
# JAX compiles with the allocator's limit as the device memory size). Deviceless, XLA
# takes 80% of the target's memory instead (DEVICELESS_BASE).
XLA_SLOP = 0.95
DEVICELESS_BASE = 0.80
DEFAULT_LAYER_BYTES = 128 * 2**20   # a 1.3B-class layer in bf16; the CLI uses the model's

_OVERLAP = ("--xla_gpu_enable_latency_hiding_scheduler=true",
            "--xla_gpu_enable_pipelined_all_gather=true",
            "--xla_gpu_enable_pipelined_reduce_scatter=true",
            "--xla_gpu_enable_pipelined_all_reduce=true",
            "--xla_gpu_enable_while_loop_double_buffering=true",
            "--xla_gpu_enable_highest_priority_async_stream=true",
            # a layer's gather and the previous layer's reduce-scatter both in flight
            "--xla_gpu_experimental_parallel_collective_overlap_limit=2")
_COMBINE = ("--xla_gpu_all_gather_combine_threshold_bytes",
            "--xla_gpu_reduce_scatter_combine_threshold_bytes",
            "--xla_gpu_all_reduce_combine_threshold_bytes")
# jaxlib (major, minor) -> (flags, threshold flag names); each started by the test suite
TESTED: dict[tuple[int, int], tuple[tuple[str, ...], tuple[str, ...]]] = {
    (0, 10): (_OVERLAP, _COMBINE), (0, 11): (_OVERLAP, _COMBINE), (0, 12): (_OVERLAP, _COMBINE)}


def jaxlib_version() -> tuple[int, int]:
    import jaxlib
    major, minor = jaxlib.__version__.split(".")[:2]
    return int(major), int(minor)


def overlap_flags(layer_bytes: int = DEFAULT_LAYER_BYTES,
                  version: tuple[int, int] | None = None) -> list[str]:
    """The flags for jaxlib ``version`` (default: installed), or [] if it is not tested."""
    version = version or jaxlib_version()
    if version not in TESTED:
        warnings.warn(f"jaxsmp sets no XLA overlap flags for jaxlib {version}: tested are "
                      f"{sorted(TESTED)}", stacklevel=2)
        return []
    flags, thresholds = TESTED[version]
    return [*flags, *(f"{name}={int(layer_bytes)}" for name in thresholds)]


def _cuda_plugin() -> bool:
    return any(find_spec(m) for m in ("jax_cuda12_plugin", "jax_cuda13_plugin"))


def _backend_started() -> bool:
    from jax._src import xla_bridge
    return xla_bridge.backends_are_initialized()


def merged(current: str, flags: list[str]) -> str:
    """``current`` XLA_FLAGS plus each of ``flags`` whose name it does not set yet."""
    names = {f.split("=", 1)[0] for f in current.split()}
    return " ".join([current.strip(), *(f for f in flags if f.split("=", 1)[0] not in names)]
                    ).strip()


def apply(layer_bytes: int = DEFAULT_LAYER_BYTES,
          env: MutableMapping[str, str] | None = None, *, gpu: bool | None = None) -> list[str]:
    """Add the overlap flags to ``env['XLA_FLAGS']`` (default ``os.environ``) when on a
    GPU (a CUDA plugin installed; ``gpu`` overrides), not opted out, and the backend not
    started, and :data:`MEM_FRACTION` unless the user set one. Flags jaxsmp set earlier
    in this process are resized; returns those added."""
    env = os.environ if env is None else env
    if not wanted(env, gpu) or _backend_started():
        return []
    env.setdefault(MEM_FRACTION_VAR, str(MEM_FRACTION))
    ours = env.get("_JAXSMP_XLA_FLAGS", "").split()
    current = " ".join(f for f in env.get("XLA_FLAGS", "").split() if f not in ours)
    flags = overlap_flags(layer_bytes)
    env["XLA_FLAGS"] = merged(current, flags)
    added = [f for f in flags if f in env["XLA_FLAGS"].split()]
    env["_JAXSMP_XLA_FLAGS"] = " ".join(added)
    return added


PIPELINED = ("--xla_gpu_enable_pipelined_all_gather", "--xla_gpu_enable_pipelined_reduce_scatter")
DOUBLE_BUFFERING = "--xla_gpu_enable_while_loop_double_buffering"


def step_compiler_options(devices: int, env: Mapping[str, str] | None = None) -> dict:
    """XLA options for one step's compile (``jax.jit``'s ``compiler_options``) on a
    mesh of ``devices``: on one device no collective is pipelined across the layer loop,
    and the loop double buffering jaxsmp's flags switch on only doubles its body. On one
    H200 (GPU check, 2026-11-27) a 20-layer Llama 2 7b-width step ran 11% slower than
    the same step without it, its program 20% more GEMM FLOPs near the memory limit. So
    it is off there, unless the user set it in ``XLA_FLAGS`` themselves."""
    env = os.environ if env is None else env
    if devices == 1 and f"{DOUBLE_BUFFERING}=true" in env.get("_JAXSMP_XLA_FLAGS", "").split():
        return {DOUBLE_BUFFERING.lstrip("-"): False}
    return {}


def _values(env: Mapping[str, str] | None) -> dict[str, str]:
    """``XLA_FLAGS`` (default ``os.environ``'s) as {flag name: value}."""
    env = os.environ if env is None else env
    return dict(f.split("=", 1) for f in env.get("XLA_FLAGS", "").split() if "=" in f)


def pipelines_collectives(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``XLA_FLAGS`` (default ``os.environ``'s) switch on XLA:GPU's pipelined
    all-gather and reduce-scatter: XLA then issues a loop's next-iteration gather and
    finishes its reduce-scatter beside the compute itself."""
    flags = _values(env)
    return all(flags.get(name, "").lower() in ("true", "1") for name in PIPELINED)


def overlap_flags_set(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``XLA_FLAGS`` (default ``os.environ``'s) names every flag of
    :func:`overlap_flags`: a program compiled now is the one a GPU run gets."""
    env = os.environ if env is None else env
    names = {f.split("=", 1)[0] for f in env.get("XLA_FLAGS", "").split()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # an untested jaxlib gets no flags: none missing
        return all(f.split("=", 1)[0] in names for f in overlap_flags())


def combine_threshold(env: Mapping[str, str] | None = None) -> int | None:
    """The all-gather combine threshold ``XLA_FLAGS`` (default ``os.environ``'s) sets, in
    bytes; ``None`` if it sets none (XLA's default)."""
    value = _values(env).get(_COMBINE[0])
    return int(value) if value is not None else None


def mem_fraction(env: Mapping[str, str] | None = None) -> float:
    """The fraction of each GPU's memory XLA may allocate in a run started with ``env``
    (default ``os.environ``): the user's ``XLA_PYTHON_CLIENT_MEM_FRACTION``, else
    :data:`MEM_FRACTION` (which :func:`apply` sets), or JAX's 0.75 if opted out."""
    env = os.environ if env is None else env
    value = env.get(MEM_FRACTION_VAR)
    if value is None:
        return MEM_FRACTION if wanted(env, gpu=True) else JAX_MEM_FRACTION
    try:
        fraction = float(value)
    except ValueError:
        fraction = float("nan")
    if not 0 < fraction <= 1:
        raise ValueError(f"{MEM_FRACTION_VAR}={value!r}: use a fraction in (0, 1], e.g. "
                         f"{MEM_FRACTION}")
    return fraction


def wanted(env: Mapping[str, str] | None = None, gpu: bool | None = None) -> bool:
    """Whether :func:`apply` would set flags: on a GPU and not opted out."""
    env = os.environ if env is None else env
    opt = env.get(OPT_OUT, "1")
    if opt not in ("0", "1"):
        raise ValueError(f"{OPT_OUT}={opt!r}: use 0 (leave XLA_FLAGS alone) or 1 (default)")
    platforms = env.get("JAX_PLATFORMS", "").lower()
    on_gpu = _cuda_plugin() and (not platforms or bool({"cuda", "gpu"} & set(platforms.split(","))))
    return opt == "1" and (on_gpu if gpu is None else gpu)
