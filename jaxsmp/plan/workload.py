"""What one model asks of each device: parameter shards, FLOPs, saved activations.

Everything comes from abstract shapes (``nnx.eval_shape``), the sharding rules
(:func:`jaxsmp.sharding.rules.resolve_spec`) and JAX's own list of the residuals a layer
saves for its backward pass (:mod:`jaxsmp.plan.residuals`), so nothing is allocated and
any model built from a :class:`jaxsmp.nn.Stack` is covered.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from collectives import axis_names
from jaxsmp.checks import positive_int
from jaxsmp.context import RING_IMPLS, choose_strategy
from jaxsmp.metrics.flops import train_flops_per_token
from jaxsmp.nn.layer_context import LayerContext, layer_context, plain_scan
from jaxsmp.nn.param import is_var, logical_axes
from jaxsmp.nn.remat import POLICIES
from jaxsmp.nn.stack import Stack
from jaxsmp.plan.calibration import ATTENTION_BACKWARD, MemoryScale, memory_scale
from jaxsmp.plan.hardware import ATTENTION_KERNELS
from jaxsmp.plan.recompute import layer_matmul_flops, recomputed_share
from jaxsmp.plan.residuals import layer_residuals
from jaxsmp.sharding.rules import DEFAULT_RULES, resolve_spec
from jaxsmp.train.precision import precision_policy
from pallas_kernels.attention import decide_impl

# Tokens of the abstract trace that measures a layer's residuals (their count per token
# does not depend on it). The odd length tells per-token residuals from per-layer ones.
_TRACE_BATCH, _TRACE_SEQ = 1, 13
# layer GEMM FLOPs per (traced model config, remat policy, with the backward): the trace
# does not depend on the workload's sequence length
_LAYER_FLOPS: dict[tuple, float] = {}
# The axes ZeRO-3 shards parameters over and the step gathers them from (sharding.rules).
_ZERO = ("sdp", "cp")


# families whose attention adds ALiBi slopes (jaxsmp/models/bloom.py)
ALIBI_FAMILIES = frozenset({"bloom"})
# the modules whose outputs the models name for ``save_qkv`` (jaxsmp.nn.remat.name_qkv)
QKV_PROJECTIONS = frozenset({"q_proj", "k_proj", "v_proj", "query_key_value"})
PALLAS_ATTENTION_BACKWARD = 3.5


def backward_ratio(kernel: str) -> float:
    """The attention backward's FLOPs over its forward's in ``kernel``: cuDNN's (and
    FlashAttention-2's) 5 score-sized matmuls to the forward's 2, or the Pallas kernels' 7
    (dq recomputes the scores for itself: 3; dk, dv: 4)."""
    return PALLAS_ATTENTION_BACKWARD if kernel == "pallas" else ATTENTION_BACKWARD


@dataclass(frozen=True)
class Param:
    path: str
    shape: tuple[int, ...]
    axes: tuple[str | None, ...]
    stacked: bool


@dataclass(frozen=True)
class Shards:
    """Elements per device of one mesh layout. ``local``: the stored shards (stacked
    layers and top-level parameters); ``layer_gathered``: one layer after the sdp (and
    cp) gather (still split over tp); ``top_gathered``: the top-level parameters the
    step gathers."""
    stacked_local: int
    top_local: int
    layer_gathered: int
    top_gathered: int
    expert_local: int = 0   # of ``stacked_local``: experts' shards (split over ep x sdp)

    @property
    def local(self) -> int:
        return self.stacked_local + self.top_local


@dataclass(frozen=True)
class Activations:
    """Bytes per token that one layer keeps for its backward pass on each device:
    ``replicated`` over tp (model width), ``split`` over tp (heads, MLP), and ``host``
    (offloaded; split over tp)."""
    replicated: float
    split: float
    host: float = 0.0

    def per_device(self, tp: int, sequence_parallel: bool = False) -> float:
        return self.replicated / (tp if sequence_parallel else 1) + self.split / tp


def _path(keys) -> str:
    return "/".join(str(getattr(k, "key", k)) for k in keys)


def _find_stack(model: nnx.Module) -> Stack:
    stacks = [m for _, m in nnx.iter_graph(model) if isinstance(m, Stack)]
    if len(stacks) != 1:
        raise ValueError(f"the planner needs the model's repeated layers in exactly one "
                         f"jaxsmp.nn.Stack; found {len(stacks)}")
    return stacks[0]


def _residual_dtype(shape: jax.ShapeDtypeStruct, backend: str) -> int:
    # XLA:CPU computes bfloat16/float16 elementwise work in float32 and keeps it so
    itemsize = jnp.dtype(shape.dtype).itemsize
    return 4 if backend == "cpu" and jnp.issubdtype(shape.dtype, jnp.floating) else itemsize


class Workload:
    """A model config trained on ``seq_len``-token sequences; ``attention_kernel``: the
    kernel to price (:data:`jaxsmp.plan.hardware.ATTENTION_KERNELS`), None: the one the
    step runs."""

    def __init__(self, config: Any, seq_len: int, attention_kernel: str | None = None):
        positive_int("seq_len", seq_len)
        if attention_kernel not in (None, *ATTENTION_KERNELS):
            raise ValueError(f"unknown attention kernel {attention_kernel!r}; known: "
                             f"{ATTENTION_KERNELS}, or None for the one the step runs")
        self.config, self.seq_len = config, seq_len
        self._kernel = attention_kernel
        model = nnx.eval_shape(lambda: config.build(nnx.Rngs(0)))
        # blockwise attention saves what FlashAttention saves and takes any length
        traced = config.replace(attention_impl="blockwise") \
            if hasattr(config, "attention_impl") else config
        self._traced = traced
        self._stack = _find_stack(nnx.eval_shape(lambda: traced.build(nnx.Rngs(0))))
        self.layers = self._stack.num_layers
        state = nnx.state(model, nnx.Param)
        leaves = jax.tree_util.tree_flatten_with_path(state, is_leaf=is_var)[0]
        self._shards: dict = {}
        self.params = tuple(
            Param(_path(keys), tuple(v.shape), logical_axes(v),
                  v.get_metadata().get("out_sharding", (None,))[:1] == ("layers",))
            for keys, v in leaves)

    # -- sizes ----------------------------------------------------------------------
    @functools.cached_property
    def total_params(self) -> int:
        return sum(math.prod(p.shape) for p in self.params)

    @functools.cached_property
    def layer_params(self) -> int:
        """Parameters of one stacked layer."""
        return sum(math.prod(p.shape[1:]) for p in self.params if p.stacked)

    def layer_bytes(self, precision: str = "bf16") -> int:
        """One stacked layer's parameters in ``precision``'s compute dtype: the size
        jaxsmp's trainer and pre-flight give XLA's combine thresholds on GPUs, so that a
        layer's gathers (and its gradients' reduce-scatters) run as one collective."""
        return self.layer_params * (4 if precision == "fp32" else 2)

    @functools.cached_property
    def layer_matmul_params(self) -> int:
        """Matmul weights (kernels) of one layer: 2 FLOPs per token each, forward."""
        return sum(math.prod(p.shape[1:]) for p in self.params if p.stacked and len(p.shape) > 2)

    @functools.cached_property
    def layer_qkv_params(self) -> int:
        """The q, k, v projections' kernels of one layer (what ``save_qkv`` keeps the
        outputs of, :data:`QKV_PROJECTIONS`)."""
        return sum(math.prod(p.shape[1:]) for p in self.params if p.stacked
                   and len(p.shape) > 2 and QKV_PROJECTIONS & set(p.path.split("/")))

    @functools.cached_property
    def layer_expert_params(self) -> int:
        """Parameters of one stacked layer's experts, all of them (a mixture of experts'
        ``experts`` axis; 0 for a dense model)."""
        return sum(math.prod(p.shape[1:]) for p in self.params
                   if p.stacked and "experts" in p.axes)

    @property
    def experts(self) -> int:
        """Experts per MoE layer (``num_local_experts``); 0 for a dense model."""
        return int(getattr(self.config, "num_local_experts", 0) or 0)

    @property
    def top_k(self) -> int:
        """Experts each token is routed to (``num_experts_per_tok``); 0 for a dense model."""
        return int(getattr(self.config, "num_experts_per_tok", 0) or 0) if self.experts else 0

    @functools.cached_property
    def fp8_linears(self) -> tuple[int, int]:
        """Linears with an amax history under ``precision="fp8"``
        (:func:`jaxsmp.train.fp8_state.runs_fp8`): (per stacked layer, outside the stack)."""
        from jaxsmp.train.fp8_state import runs_fp8
        model = nnx.eval_shape(lambda: self.config.build(nnx.Rngs(0)))
        stacked = top = 0
        for _, module in nnx.iter_modules(model):
            if runs_fp8(module):
                lead = module.kernel.get_metadata().get("out_sharding", (None,))[:1]
                stacked += lead == ("layers",)
                top += lead != ("layers",)
        return stacked, top

    @property
    def hidden(self) -> int:
        return self.config.hidden_size

    @property
    def vocab(self) -> int:
        return self.config.vocab_size

    @property
    def heads(self) -> int:
        return self.config.num_attention_heads

    @property
    def kv_heads(self) -> int:
        return getattr(self.config, "kv_heads", self.heads)

    @functools.cached_property
    def family(self) -> str | None:
        """The model family ("llama", ...), None for a config jaxsmp has no mapping of."""
        from jaxsmp.hf.config import CONFIG_TYPES
        return CONFIG_TYPES.get(type(self.config))

    @property
    def memory_scale(self) -> MemoryScale:
        """Compiled over analytic memory-bound time of this family (calibration)."""
        return memory_scale(self.family)

    @property
    def attention_kernel(self) -> str:
        """The attention kernel the step runs on GPUs in bf16 (:meth:`attention_kernel_at`)."""
        return self.attention_kernel_at("bf16")

    def attention_kernel_at(self, precision: str) -> str:
        """The attention kernel the step runs on a CUDA GPU under ``precision``: the one
        ``attention_impl="auto"`` picks there (:func:`pallas_kernels.attention.decide_impl`
        on the compute dtype, head dim and ALiBi): ``cudnn``, or ``pallas`` where cuDNN
        refuses the inputs (float32, Bloom's ALiBi); the config's ``cudnn`` or ``pallas``
        when it asks for one; or the kernel this workload was built to price."""
        if self._kernel is not None:
            return self._kernel
        impl = getattr(self.config, "attention_impl", "auto")
        if impl in ("cudnn", "pallas"):
            return impl
        dtype = precision_policy(precision).compute_dtype
        head_dim = getattr(self.config, "head_dim", self.hidden // self.heads)
        return decide_impl(dtype, head_dim, alibi=self.family in ALIBI_FAMILIES,
                           segments=False, platform="cuda")[0]

    @property
    def tied(self) -> bool:
        return bool(getattr(self.config, "tie_word_embeddings", False))

    def context_strategy(self, cp: int, tp: int, backend: str = "gpu") -> str:
        """The attention ``context_parallel="auto"`` runs on a ``cp`` mesh of ``backend``
        devices (:func:`jaxsmp.context.choose_strategy`)."""
        impl = getattr(self.config, "attention_impl", "auto")
        return choose_strategy(self.heads, cp, tp, "cuda" if backend == "gpu" else "cpu",
                               ring_ok=impl in RING_IMPLS)

    @functools.cached_property
    def model_flops_per_token(self) -> float:
        """Model FLOPs per trained token (6N + attention; :mod:`jaxsmp.metrics.flops`)."""
        return train_flops_per_token(self.config, self.seq_len)

    def shards(self, mesh_shape: Mapping[str, int], rules: Mapping | None = None) -> Shards:
        """Per-device elements on a mesh of ``mesh_shape`` degrees (``ValueError`` if a
        parameter does not divide)."""
        rules = DEFAULT_RULES if rules is None else rules
        key = (tuple(sorted(mesh_shape.items())), tuple(sorted(rules.items())))
        if key not in self._shards:
            self._shards[key] = self._compute_shards(mesh_shape, rules)
        return self._shards[key]

    def _compute_shards(self, mesh_shape: Mapping[str, int], rules: Mapping) -> Shards:
        stacked = top = layer = top_gathered = expert = 0
        for p in self.params:
            spec = resolve_spec(p.path, p.axes, p.shape, mesh_shape, rules)
            split = [math.prod(mesh_shape[a] for a in axis_names(d)) for d in spec]
            local = math.prod(n // k for n, k in zip(p.shape, split))
            no_sdp = [k // math.prod(mesh_shape[a] for a in _ZERO if a in axis_names(d))
                      for d, k in zip(spec, split)]
            if p.stacked:
                stacked += local
                expert += local if "experts" in p.axes else 0
                layer += math.prod(n // k for n, k in zip(p.shape[1:], no_sdp[1:]))
            else:
                top += local
                if not self._looked_up(p):
                    top_gathered += math.prod(n // k for n, k in zip(p.shape, no_sdp))
        return Shards(stacked, top, layer, top_gathered, expert)

    def _looked_up(self, p: Param) -> bool:
        """An untied embedding table is read from its shards, never gathered
        (:mod:`jaxsmp.train.embed_lookup`)."""
        return p.axes == ("vocab", "embed") and not self.tied and "embed" in p.path.split("/")[0]

    # -- activations ----------------------------------------------------------------
    @functools.cache
    def activations(self, remat: str, precision: str, backend: str = "gpu") -> Activations:
        """What one layer keeps per token for its backward pass under ``remat``, from the
        residuals JAX saves (traced abstractly); ``full`` keeps the layer input only,
        ``offload`` keeps the matmul outputs in host memory."""
        if remat not in POLICIES:
            raise ValueError(f"unknown remat policy {remat!r}; valid: {POLICIES}")
        dtype = precision_policy(precision).compute_dtype
        if remat == "offload":  # what save_matmuls keeps, moved to host memory
            kept, _ = self._residual_bytes("full", dtype, backend)
            replicated, split = self._residual_bytes("save_matmuls", dtype, backend)
            return Activations(replicated=kept, split=0.0, host=replicated + split - kept)
        replicated, split = self._residual_bytes(remat, dtype, backend)
        return Activations(replicated=replicated, split=split)

    @functools.cache
    def recomputed_share(self, remat: str) -> float:
        """The share of one layer's forward GEMM FLOPs its backward pass runs again under
        ``remat``, counted in JAX's program (:mod:`jaxsmp.plan.recompute`)."""
        if remat not in POLICIES:
            raise ValueError(f"unknown remat policy {remat!r}; valid: {POLICIES}")
        return recomputed_share(self._layer_matmul_flops, remat)

    def _layer_matmul_flops(self, policy: str, grad: bool) -> float:
        # traced at a fixed small shape: one count per model config, whatever the workload
        def count() -> float:
            return layer_matmul_flops(lambda p: self.layer_loss(p, jnp.bfloat16), policy, grad)
        key = (self._traced, policy, grad)
        try:
            hash(key)
        except TypeError:   # a config that cannot be a key is counted each time
            return count()
        if key not in _LAYER_FLOPS:
            _LAYER_FLOPS[key] = count()
        return _LAYER_FLOPS[key]

    def layer_loss(self, remat: str, dtype) -> tuple[Any, tuple]:
        """(a loss of one stacked layer's output under jaxsmp's remat policy ``remat``,
        its abstract arguments (the layer's parameters, the carry, the extra arguments),
        in ``dtype``): what :meth:`activations` takes JAX's residuals of and
        :mod:`jaxsmp.plan.recompute` counts the backward's GEMMs in."""
        _, stacked = nnx.split(self._stack.layers)
        one = jax.tree.map(lambda v: jax.ShapeDtypeStruct((1, *v.shape[1:]), dtype), stacked)
        # the carry the model passes its stack (a mixture of experts' carries its router
        # statistics beside the hidden state), with the hidden state in ``dtype``
        carry, args = self._layer_args
        x = jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, dtype)
                         if v.shape[-1:] == (self.hidden,) else v, carry)

        def loss(layer, h, args):
            out = {}

            def hook(run, x_stack, params, stack_args):
                out["y"] = run(h, layer, args)
                return x_stack
            scan = functools.partial(plain_scan, remat_policy=remat)
            with layer_context(LayerContext(scan_layers=scan, run_stages=hook)):
                self._stack(h, *args)
            return sum(y.astype(jnp.float32).sum() for y in jax.tree.leaves(out["y"]))
        return loss, (one, x, args)

    @functools.cache
    def _residual_bytes(self, remat: str, dtype, backend: str) -> tuple[float, float]:
        """(replicated, split) bytes per token of one layer's residuals: the ``Stack``
        runs one layer on ``x`` under jaxsmp's remat policy ``remat``, abstractly."""
        tokens = _TRACE_BATCH * _TRACE_SEQ
        loss, arguments = self.layer_loss(remat, dtype)
        replicated = split = 0.0
        for shape, source in layer_residuals(loss, *arguments):
            per_layer = "output of scan" in source or "argument h" in source
            if not per_layer or not self._per_token(shape.shape):
                continue  # weights, per-channel constants, what all layers share
            nbytes = float(np.prod(shape.shape)) * _residual_dtype(shape, backend) / tokens
            if shape.shape[-1] != self.hidden:
                split += nbytes     # [.., heads, head_dim], an MLP or fused-QKV width
            else:
                replicated += nbytes
        return replicated, split

    def _per_token(self, shape: tuple[int, ...]) -> bool:
        """A residual with a token dimension: the trace's tokens, or a mixture of
        experts' ``tokens x top_k`` assignment rows."""
        return _TRACE_SEQ in shape or (
            self.top_k > 0 and _TRACE_BATCH * _TRACE_SEQ * self.top_k in shape)

    @functools.cached_property
    def _layer_args(self) -> tuple:
        """(the carry, the extra arguments) the model passes its stacked layers (the
        hidden state, with a mixture of experts' router statistics; e.g. rotary tables),
        as abstract values, captured by a pipeline hook in an abstract forward pass."""
        captured = {}

        def hook(run, x, params, args):
            captured["args"] = (x, tuple(args))
            return x

        def forward(state):
            with layer_context(LayerContext(run_stages=hook)):
                nnx.merge(graphdef, state)(jnp.zeros((_TRACE_BATCH, _TRACE_SEQ), jnp.int32))
            return captured.pop("args")
        graphdef, state = nnx.split(nnx.eval_shape(lambda: self._traced.build(nnx.Rngs(0))))
        return jax.eval_shape(forward, state)


