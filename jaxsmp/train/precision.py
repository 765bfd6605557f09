"""Mixed-precision policies: float32 master parameters, a compute dtype, loss scaling."""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import struct


@dataclass(frozen=True)
class Precision:
    """``compute_dtype`` for parameters and activations in the forward/backward pass;
    ``loss_scaling`` for float16, whose small range needs dynamic loss scaling; ``fp8``:
    the big matmuls run in float8 with delayed scaling (:mod:`jaxsmp.nn.fp8`)."""
    compute_dtype: jnp.dtype
    loss_scaling: bool
    fp8: bool = False

    @property
    def compiler_options(self) -> dict:
        """The XLA options a step of this precision is compiled with (``jax.jit``'s
        ``compiler_options``): :data:`FP8_COMPILER_OPTIONS` for fp8, else none."""
        return dict(FP8_COMPILER_OPTIONS) if self.fp8 else {}


# fp8 compiles without Triton GEMMs: with them XLA:GPU fuses the float8 -> bf16 converts
# into bf16 Triton GEMMs, without them its GEMM rewriter makes the dequantized dots
# cuBLASLt FP8 GEMMs. The option is per program, not per dot (docs/fp8.md: what it costs
# the GEMMs left in bf16); XLA:CPU accepts it and has no Triton GEMMs to turn off.
FP8_COMPILER_OPTIONS = {"xla_gpu_enable_triton_gemm": False}


PRECISIONS = {
    "fp32": Precision(jnp.float32, False),
    "bf16": Precision(jnp.bfloat16, False),
    "fp16": Precision(jnp.float16, True),
    "fp8": Precision(jnp.bfloat16, False, fp8=True),
}


def precision_policy(name: str) -> Precision:
    if name not in PRECISIONS:
        raise ValueError(f"unknown precision {name!r}; valid: {sorted(PRECISIONS)}")
    return PRECISIONS[name]


@struct.dataclass
class LossScale:
    """Dynamic loss scale: halves on overflow, doubles after ``period`` finite steps."""
    scale: jax.Array
    good_steps: jax.Array
    period: int = struct.field(pytree_node=False, default=2000)

    @classmethod
    def create(cls, initial: float = 2.0 ** 15, period: int = 2000) -> LossScale:
        return cls(jnp.float32(initial), jnp.int32(0), period)

    def update(self, finite: jax.Array) -> LossScale:
        grow = finite & (self.good_steps + 1 >= self.period)
        scale = jnp.where(finite, jnp.where(grow, self.scale * 2, self.scale),
                          jnp.maximum(self.scale / 2, 1.0))
        good = jnp.where(finite & ~grow, self.good_steps + 1, 0)
        return LossScale(scale, good.astype(jnp.int32), self.period)
