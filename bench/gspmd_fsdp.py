"""A hand-written GSPMD FSDP train step of the kind a MaxText user writes: the contender
that ``bench/fsdp_compare.py`` compiles beside jaxsmp's step.

A plain JAX Llama (RMSNorm, rotary, SwiGLU) or GPT-NeoX block (``kind="gelu"``: RMSNorm for
its LayerNorms, parallel residual, a GELU MLP; no biases, full rotary; the norm is
``jaxsmp.nn.norm``'s and the loss ``jaxsmp.losses.next_token_loss`` on bf16 logits, as in
jaxsmp's step, so that the two differ in how they shard), its layers stacked
under ``lax.scan`` with ``jax.checkpoint``; float32 master weights,
each split over ``fsdp`` on its largest dimension (with ``tp``: Megatron's column / row
splits, ``fsdp`` on the other dimension); activations constrained to batch sharding at
every layer boundary; bf16 compute, ``jax.nn.dot_product_attention(implementation=
"cudnn")``, ``optax.adamw``; one ``jax.jit`` with in and out shardings.

Variants (``cast``): ``layer`` casts each layer's weights to bf16 inside the loop (the
plain way), ``stack`` casts the whole stack of shards to bf16 before the loop, so the
all-gathers move bf16 whatever XLA makes of the converts. (``gather``): ``auto`` leaves
to GSPMD how each GEMM meets its split weight: where the activations are smaller than
the weight (GPT-NeoX-20B's MLP and vocabulary head at 16k tokens) it keeps the weight
split and all-gathers the activations over the batch instead, reduce-scattering the
GEMM's partial output (Megatron's tensor parallelism run over ``fsdp``); ``weights``
constrains every bf16 weight whole inside the (rematerialized) layer and the head, so
each is all-gathered and its gradient reduce-scattered: ZeRO-3, what jaxsmp's step does.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxsmp.losses import next_token_loss
from jaxsmp.nn.norm import rms_norm
from jaxsmp.plan import gpu_target

REMAT = {"full": jax.checkpoint_policies.nothing_saveable,
         "save_matmuls": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
         "none": None}


@dataclass(frozen=True)
class Width:
    vocab: int
    d: int
    heads: int
    mlp: int
    layers: int
    kind: str = "swiglu"   # or "gelu": GPT-NeoX's parallel block


# The layer names and (in, out) axes: "col" splits the output over tp, "row" the input
_MATS = {"wq": ("d", "d", "col"), "wk": ("d", "d", "col"), "wv": ("d", "d", "col"),
         "wo": ("d", "d", "row"), "w_gate": ("d", "mlp", "col"), "w_up": ("d", "mlp", "col"),
         "w_down": ("mlp", "d", "row")}


def _mats(w: Width) -> dict:
    if w.kind == "swiglu":
        return _MATS
    return {k: v for k, v in _MATS.items() if k != "w_gate"}


def shapes(w: Width) -> dict:
    size = {"d": w.d, "mlp": w.mlp}
    layer = {k: (w.layers, size[i], size[o]) for k, (i, o, _) in _mats(w).items()}
    layer.update(attn_norm=(w.layers, w.d), mlp_norm=(w.layers, w.d))
    return {"embed": (w.vocab, w.d), "layers": layer, "final_norm": (w.d,),
            "lm_head": (w.d, w.vocab)}


def specs(w: Width, tp: bool) -> dict:
    """fsdp on each weight's largest dimension; with tp, Megatron's splits and fsdp on
    the other dimension."""
    def mat(kind: str, rows: int, cols: int) -> P:
        if tp:
            return P(None, "fsdp", "tp") if kind == "col" else P(None, "tp", "fsdp")
        return P(None, "fsdp", None) if rows >= cols else P(None, None, "fsdp")
    size = {"d": w.d, "mlp": w.mlp}
    layer = {k: mat(kind, size[i], size[o]) for k, (i, o, kind) in _mats(w).items()}
    layer.update(attn_norm=P(None, "fsdp"), mlp_norm=P(None, "fsdp"))
    return {"embed": P("tp" if tp else "fsdp", "fsdp" if tp else None),
            "layers": layer, "final_norm": P("fsdp"),
            "lm_head": P("fsdp", "tp") if tp else P(None, "fsdp")}


def _rms(x, g):
    # jaxsmp's norm, which keeps only its input and per-token statistics for the backward
    # pass: the same in both steps, so that they differ in how they shard, not in it
    return rms_norm(x, g, 1e-5).astype(jnp.bfloat16)


def _rotary(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return (x * cos + jnp.concatenate([-x2, x1], -1) * sin).astype(x.dtype)


def _whole(spec: P) -> P:
    """``spec`` of one weight (no stack dimension) with ``fsdp`` dropped: gathered."""
    return P(*[None if a == "fsdp" else a for a in spec])


def _layer(w: Width, batch_spec: P, whole: dict | None = None):
    def attention(x, p, cos, sin):
        b, s, d = x.shape
        hd = d // w.heads
        q, k, v = ((x @ p[n]).reshape(b, s, w.heads, hd) for n in ("wq", "wk", "wv"))
        q, k = _rotary(q, cos, sin), _rotary(k, cos, sin)
        a = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
        return a.reshape(b, s, d) @ p["wo"]

    def layer(h, p, cos, sin):
        if whole is not None:   # gather="weights": each weight gathered here, in remat
            p = {k: jax.lax.with_sharding_constraint(v, whole[k]) for k, v in p.items()}
        if w.kind == "gelu":   # GPT-NeoX: h + attn(ln1(h)) + mlp(ln2(h))
            mlp = jax.nn.gelu(_rms(h, p["mlp_norm"]) @ p["w_up"]) @ p["w_down"]
            h = h + attention(_rms(h, p["attn_norm"]), p, cos, sin) + mlp
        else:
            h = h + attention(_rms(h, p["attn_norm"]), p, cos, sin)
            x = _rms(h, p["mlp_norm"])
            h = h + (jax.nn.silu(x @ p["w_gate"]) * (x @ p["w_up"])) @ p["w_down"]
        return jax.lax.with_sharding_constraint(h, batch_spec)
    return layer


def loss_fn(params, tokens, w: Width, remat: str, cast: str, batch_spec: P,
            gather: str = "auto", tp: bool = False):
    bf16 = lambda t: jax.tree.map(lambda x: x.astype(jnp.bfloat16), t)
    s = tokens.shape[1]
    hd = w.d // w.heads
    freq = 1.0 / (10000.0 ** (np.arange(0, hd, 2) / hd))
    angle = np.concatenate([np.outer(np.arange(s), freq)] * 2, -1)[None, :, None, :]
    cos, sin = jnp.asarray(np.cos(angle), jnp.bfloat16), jnp.asarray(np.sin(angle), jnp.bfloat16)
    h = jax.lax.with_sharding_constraint(
        params["embed"][tokens].astype(jnp.bfloat16), batch_spec)
    whole = None
    if gather == "weights":
        whole = {k: _whole(P(*v[1:])) for k, v in specs(w, tp)["layers"].items()}
    layer = _layer(w, batch_spec, whole)
    if REMAT[remat] is not None:
        layer = jax.checkpoint(layer, policy=REMAT[remat], prevent_cse=False)
    stack = bf16(params["layers"]) if cast == "stack" else params["layers"]

    def body(h, p):
        return layer(h, bf16(p), cos, sin), None
    h, _ = jax.lax.scan(body, h, stack)
    head = params["lm_head"].astype(jnp.bfloat16)
    if gather == "weights":
        head = jax.lax.with_sharding_constraint(head, _whole(specs(w, tp)["lm_head"]))
    return next_token_loss(_rms(h, params["final_norm"]) @ head, tokens)


def compile_step(devices, mesh_shape: dict, w: Width, seq: int, batch: int,
                 remat: str = "full", cast: str = "layer", gather: str = "auto"):
    """The step compiled for ``devices`` (XLA:GPU topology devices) on a mesh
    ``{"fsdp": n, "tp": m}``, from abstract parameters and optimizer state."""
    if gather not in ("auto", "weights"):
        raise ValueError(f"gather={gather!r}: expected 'auto' or 'weights'")
    tp = mesh_shape.get("tp", 1) > 1
    mesh = jax.sharding.Mesh(np.asarray(devices).reshape(mesh_shape["fsdp"],
                                                         mesh_shape.get("tp", 1)),
                             ("fsdp", "tp"))
    batch_spec = P("fsdp", None, None)
    sh = lambda spec: NamedSharding(mesh, spec)
    param_sh = jax.tree.map(sh, specs(w, tp), is_leaf=lambda x: isinstance(x, P))
    abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s, jnp.float32), shapes(w),
                            is_leaf=lambda x: isinstance(x, tuple))
    opt = optax.adamw(1e-4)
    opt_abs = jax.eval_shape(opt.init, abstract)
    opt_sh = optax.tree_map_params(opt, lambda _, s: s, opt_abs, param_sh,
                                   transform_non_params=lambda _: sh(P()))
    tokens = jax.ShapeDtypeStruct((batch, seq), jnp.int32)

    def step(params, opt_state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, w, remat, cast, batch_spec,
                                                   gather, tp)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    jitted = jax.jit(step, in_shardings=(param_sh, opt_sh, sh(P("fsdp", None))),
                     out_shardings=(param_sh, opt_sh, sh(P())), donate_argnums=(0, 1))
    # XLA's memory limit as a run has it, as jaxsmp's deviceless steps compile
    placed = lambda tree, shardings: jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings)
    arguments = gpu_target.argument_bytes(placed(abstract, param_sh), placed(opt_abs, opt_sh),
                                          placed(tokens, sh(P("fsdp", None))))
    with jax.set_mesh(mesh):
        return jitted.lower(abstract, opt_abs, tokens).compile(
            gpu_target.memory_limit_options(gpu_target.gpu_of(devices), arguments))
