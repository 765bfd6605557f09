"""The attention entry point: validates inputs and dispatches to an implementation by name.

``auto`` picks, from the inputs and the platform the call is compiled for
(:func:`choose_impl`; by default JAX's default backend, inside a ``jaxsmp`` step the
platform of its mesh's devices, so a step compiled for GPUs on a CPU host gets the GPU
choice):

* NVIDIA GPU (``cuda``): ``cudnn`` (``jax.nn.dot_product_attention(implementation="cudnn")``, the
  fused cuDNN FlashAttention) for float16/bfloat16 inputs without ALiBi or segment ids
  whose head dim is a multiple of 8 up to 128; otherwise ``pallas`` (the FlashAttention
  kernels here, compiled by Triton), which takes ALiBi, segment ids, float32 and any head
  dim or sequence length by zero-padding to its tile shapes.
* AMD GPU (``rocm``): ``pallas``.
* elsewhere (CPU): ``reference`` while one float32 score matrix ``[b, h, s, s]`` fits
  :data:`REFERENCE_SCORE_BYTES` (32 MiB; the step keeps about three such arrays per layer
  call: scores, probabilities and their cotangent), since XLA:CPU runs its plain matmuls
  faster than the loop; beyond it ``blockwise``, the same online-softmax algorithm as
  XLA loops, whose temporaries grow with ``s * block`` instead of ``s * s``.

``reference`` materialises the scores (the tests' ground truth); for the backward pass it
keeps nothing score-sized and recomputes them (:func:`_reference`).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from pallas_kernels.blockwise import blockwise_attention
from pallas_kernels.flash_tuning import row_bytes, seq_multiple
from pallas_kernels.padding import pad_for_pallas
from pallas_kernels.reference import attention_reference

IMPLS = ("auto", "reference", "blockwise", "pallas", "cudnn")
DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
# Blockwise's default (block_q, block_k), capped at the sequence length (Pallas: each
# kernel's own, ``pallas_kernels.flash_tuning.LAUNCH``)
DEFAULT_BLOCKS = {"blockwise": (512, 512)}
CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)
CUDNN_MAX_HEAD_DIM = 128
REFERENCE_SCORE_BYTES = 32 * 2**20  # off GPU, auto materialises scores up to this size


GPU_PLATFORMS = ("cuda", "rocm", "gpu")  # "gpu": JAX's default backend name for either


def choose_impl(dtype, head_dim: int, *, alibi: bool, segments: bool,
                platform: str | None = None, score_bytes: int | None = None) -> str:
    """The implementation ``impl="auto"`` runs for these inputs when compiled for
    ``platform`` (a device's ``platform``: ``cuda``, ``rocm``, ``cpu``, ...; default:
    the platform of JAX's default device); ``score_bytes``: one float32 ``[b, h, s, s]`` score matrix
    (None: unknown, so not materialised). See the module docstring."""
    return decide_impl(dtype, head_dim, alibi=alibi, segments=segments, platform=platform,
                       score_bytes=score_bytes)[0]


def _cudnn_refusal(dtype, head_dim: int, alibi: bool, segments: bool) -> str | None:
    """Why cuDNN's kernel cannot take these inputs (None: it can)."""
    if jnp.dtype(dtype) not in map(jnp.dtype, CUDNN_DTYPES):
        return f"{jnp.dtype(dtype).name} inputs (cuDNN takes float16 and bfloat16)"
    if alibi or segments:
        return "ALiBi slopes" if alibi else "segment ids (packed sequences)"
    if head_dim % 8 or head_dim > CUDNN_MAX_HEAD_DIM:
        return f"head_dim {head_dim} (cuDNN: a multiple of 8 up to {CUDNN_MAX_HEAD_DIM})"
    return None


def decide_impl(dtype, head_dim: int, *, alibi: bool, segments: bool,
                platform: str | None = None, score_bytes: int | None = None) -> tuple[str, str]:
    """(:func:`choose_impl`'s implementation, why it is the one)."""
    platform = jax.devices()[0].platform if platform is None else platform
    if platform not in GPU_PLATFORMS:
        mib = lambda n: f"{n / 2**20:.3g} MiB"
        limit = mib(REFERENCE_SCORE_BYTES)
        if score_bytes is not None and score_bytes <= REFERENCE_SCORE_BYTES:
            return "reference", (f"{platform}: one float32 score matrix ({mib(score_bytes)}) "
                                 f"fits {limit}, and XLA runs plain matmuls fastest")
        size = "of unknown size" if score_bytes is None else f"of {mib(score_bytes)}"
        return "blockwise", f"{platform}: one float32 score matrix {size} exceeds {limit}"
    if platform == "rocm":
        return "pallas", "rocm: cuDNN is NVIDIA's; the Triton kernel runs on AMD GPUs"
    refusal = _cudnn_refusal(dtype, head_dim, alibi, segments)
    if refusal is None:
        return "cudnn", (f"{platform}: {jnp.dtype(dtype).name}, head_dim {head_dim}, no ALiBi "
                         f"or segment ids: cuDNN's fused kernel takes them")
    return "pallas", f"{platform}: cuDNN's kernel does not take {refusal}"


def _check_shapes(q: jax.Array, k: jax.Array, v: jax.Array, alibi_slopes: jax.Array | None,
                  segment_ids: jax.Array | None) -> None:
    if q.ndim != 4 or k.ndim != 4 or v.shape != k.shape:
        raise ValueError(f"expected q [b, s, h, d] and k, v [b, s, kv_h, d] of equal shape; "
                         f"got q {q.shape}, k {k.shape}, v {v.shape}")
    b, s, h, d = q.shape
    if (k.shape[0], k.shape[1], k.shape[3]) != (b, s, d):
        raise ValueError(f"k/v batch, seq and head_dim must match q: q {q.shape}, k {k.shape}")
    if h % k.shape[2]:
        raise ValueError(f"kv heads {k.shape[2]} must divide query heads {h}")
    if alibi_slopes is not None and alibi_slopes.shape != (h,):
        raise ValueError(f"alibi_slopes must have shape ({h},), got {alibi_slopes.shape}")
    if segment_ids is not None and (segment_ids.shape != (b, s)
                                    or not jnp.issubdtype(segment_ids.dtype, jnp.integer)):
        raise ValueError(f"segment_ids must be integer [{b}, {s}], got "
                         f"{segment_ids.dtype}{list(segment_ids.shape)}")
    if not all(x.dtype in DTYPES for x in (q, k, v)) or len({q.dtype, k.dtype, v.dtype}) > 1:
        raise ValueError(f"q, k, v must share one dtype among float32, bfloat16, float16; "
                         f"got {q.dtype}, {k.dtype}, {v.dtype}")


def _check_blocks(impl: str, seq_len: int, block_q: int | None, block_k: int | None) -> None:
    for name, block in (("block_q", block_q), ("block_k", block_k)):
        if block is None:  # Pallas: each kernel's own
            continue
        if impl == "blockwise" and (block < 1 or seq_len % block):
            raise ValueError(f"{name}={block} must be positive and divide seq len {seq_len} "
                             f"(blockwise inputs are not padded)")
        if impl == "pallas" and (block < 16 or block & (block - 1)):
            raise ValueError(f"impl 'pallas' needs {name} a power of two >= 16, got {block}")


def _cudnn(q, k, v, alibi_slopes, segment_ids, scale, causal) -> jax.Array:
    if alibi_slopes is not None or segment_ids is not None:
        raise ValueError("impl 'cudnn' takes neither ALiBi slopes nor segment ids; use "
                         "impl 'pallas' (or 'auto', which does)")
    if q.dtype not in CUDNN_DTYPES:
        raise ValueError(f"impl 'cudnn' needs float16 or bfloat16 inputs, got {q.dtype}")
    try:
        return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=causal,
                                            implementation="cudnn")
    except RuntimeError as e:  # e.g. "cuDNN is not detected."
        raise RuntimeError(f"impl 'cudnn' needs an NVIDIA GPU with cuDNN "
                           f"(pip install 'jax[cuda12]'): {e}") from e


def _pallas(q, k, v, slopes, segment_ids, scale, causal, block_q, block_k, interpret):
    from pallas_kernels.flash_attention import flash_attention  # Triton: loaded on use
    multiple = seq_multiple(row_bytes(q.shape[3], q.dtype), q.shape[1], block_q, block_k)
    (q, k, v, segment_ids), unpad = pad_for_pallas(q, k, v, segment_ids, causal=causal,
                                                   multiple=multiple)

    def run(interpret: bool) -> jax.Array:
        return flash_attention(q, k, v, slopes, segment_ids, scale, causal, block_q, block_k,
                               interpret)
    if interpret is None:  # compiled where Triton runs, interpreted elsewhere
        out = jax.lax.platform_dependent(cuda=lambda: run(False), rocm=lambda: run(False),
                                         default=lambda: run(True))
    else:
        out = run(interpret)
    return unpad(out)


def _default_block(which: int, seq_len: int) -> int:
    return min(DEFAULT_BLOCKS["blockwise"][which], seq_len)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool,
              alibi_slopes: jax.Array | None = None, segment_ids: jax.Array | None = None,
              softmax_scale: float | None = None, impl: str = "auto",
              block_q: int | None = None, block_k: int | None = None,
              interpret: bool | None = None, platform: str | None = None) -> jax.Array:
    """Softmax attention on q [b, s, h, d] and k, v [b, s, kv_h, d] (kv_h divides h).

    ALiBi adds ``slope[h] * (k_pos - q_pos)`` to the scaled scores; ``segment_ids`` [b, s]
    restricts attention to equal ids (packed sequences). ``impl``: one of :data:`IMPLS`
    (``auto``: see the module docstring; ``platform`` is the one it decides for,
    default: that of JAX's default device). Block sizes default to :data:`DEFAULT_BLOCKS`
    (blockwise) or each Pallas kernel's own (``flash_tuning.LAUNCH``), capped at the
    sequence length; given, they apply to every Pallas kernel. ``interpret`` runs the Pallas
    kernels in JAX's interpreter (default: compiled by Triton when lowered for a GPU,
    interpreted for any other platform). ALiBi slopes
    are treated as constants by the blockwise and Pallas gradients.
    """
    if impl not in IMPLS:
        raise ValueError(f"unknown attention impl {impl!r}; valid: {IMPLS}")
    _check_shapes(q, k, v, alibi_slopes, segment_ids)
    if impl == "auto":
        b, s, h, _ = q.shape
        impl = choose_impl(q.dtype, q.shape[3], alibi=alibi_slopes is not None,
                           segments=segment_ids is not None, platform=platform,
                           score_bytes=b * h * s * s * 4)
    scale = q.shape[3] ** -0.5 if softmax_scale is None else float(softmax_scale)
    if impl in ("reference", "cudnn") and (block_q is not None or block_k is not None):
        raise ValueError(f"impl {impl!r} has no blocks; block_q/block_k must be None")
    if impl != "pallas" and interpret is not None:
        raise ValueError(f"interpret applies to impl 'pallas' only, not {impl!r}")
    if impl == "reference":
        return _reference(q, k, v, alibi_slopes, segment_ids, scale, causal)
    if impl == "cudnn":
        return _cudnn(q, k, v, alibi_slopes, segment_ids, scale, causal)
    seq_len = q.shape[1]
    if impl == "blockwise":
        block_q = _default_block(0, seq_len) if block_q is None else block_q
        block_k = _default_block(1, seq_len) if block_k is None else block_k
    _check_blocks(impl, seq_len, block_q, block_k)
    if alibi_slopes is not None:
        alibi_slopes = jax.lax.stop_gradient(alibi_slopes.astype(jnp.float32))
    if segment_ids is not None:
        segment_ids = segment_ids.astype(jnp.int32)
    if impl == "pallas":
        return _pallas(q, k, v, alibi_slopes, segment_ids, scale, bool(causal), block_q,
                       block_k, interpret)
    return blockwise_attention(q, k, v, alibi_slopes, segment_ids, scale, bool(causal),
                               block_q, block_k)


def _reference(q, k, v, alibi_slopes, segment_ids, scale: float, causal: bool) -> jax.Array:
    """:func:`attention_reference` keeping nothing score-sized for the backward pass,
    which recomputes the scores and probabilities from q, k, v (as FlashAttention does).
    Autodiff would keep four float32 and two bool ``[b, h, s, s]`` arrays per call, per
    layer for the whole backward pass of a layer scan; keeping only the probabilities
    still cost one. On CPU recomputing is also the fastest (docs/benchmarks.md)."""
    def run(q, k, v, alibi_slopes, segment_ids):
        return attention_reference(q, k, v, causal=causal, alibi_slopes=alibi_slopes,
                                   segment_ids=segment_ids, softmax_scale=scale)
    policy = jax.checkpoint_policies.nothing_saveable
    return jax.checkpoint(run, policy=policy)(q, k, v, alibi_slopes, segment_ids)
