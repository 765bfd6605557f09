"""The contenders of ``bench/train_throughput.py``: its workloads, the hand-written
plain JAX + Flax + optax baselines and jaxsmp's steps, paired (``PAIRS``) as that
script's docstring describes. Imported by the harness after it has set up the simulated
devices."""
from __future__ import annotations

import jax
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxsmp

WORKLOADS = {
    "W0": lambda: jaxsmp.models.preset(
        "gpt_neox", "tiny", num_hidden_layers=4, hidden_size=256, num_attention_heads=4,
        intermediate_size=1024, vocab_size=1024),
    "125m": lambda: jaxsmp.models.preset("gpt_neox", "125m"),
}


# ---------------------------------------------------------------- hand-written baselines

def _first_divisible(x, axis: str, n: int, skip: int, dims: list) -> list:
    for i in range(skip, x.ndim):
        if dims[i] is None and x.shape[i] % n == 0:
            dims[i] = axis
            break
    return dims


def fsdp_spec(path: str, x, mesh) -> P:
    """Every array sharded over "fsdp" on its first divisible dimension (not the
    stacked-layer one); replicated when the mesh has no "fsdp" axis or nothing divides."""
    dims = [None] * x.ndim
    if "fsdp" in mesh.shape:
        _first_divisible(x, "fsdp", mesh.shape["fsdp"], 1 if "layers" in path else 0, dims)
    return P(*dims)


# Megatron: (parameter name, kernel or bias) -> which kernel dimension goes to tp.
# Column-parallel (output split): qkv and MLP-in; row-parallel (input split): attention
# out and MLP-out, whose bias stays whole over tp.
_COLUMN = ("query_key_value", "dense_h_to_4h")
_ROW = ("attention']['dense'", "dense_4h_to_h")


def tp_spec(path: str, x, mesh) -> P:
    """Megatron split over "tp" of the attention and MLP projections, then FSDP over
    "fsdp" on the first remaining divisible dimension; everything else FSDP only."""
    dims = [None] * x.ndim
    stacked = "layers" in path
    kernel = path.endswith("['kernel']") or path.endswith("['kernel'].value")
    if any(n in path for n in _COLUMN):
        dims[-1] = "tp"                       # kernel [.., in, out] and bias [.., out]
    elif any(n in path for n in _ROW) and kernel:
        dims[-2] = "tp"                       # kernel [.., in, out]: in split
    _first_divisible(x, "fsdp", mesh.shape["fsdp"], 1 if stacked else 0, dims)
    return P(*dims)


def _layer_scan(remat: bool, constraint: NamedSharding | None):
    """How a Stack runs its layers in the baseline (installed through the model's layer
    hook): one scan; with ``remat`` each layer under jax.checkpoint (recomputed in the
    backward pass); with ``constraint`` the activations between layers pinned to it."""
    def pin(x):
        return x if constraint is None else jax.lax.with_sharding_constraint(x, constraint)

    def scan(apply, h, params, args):
        def body(carry, one):
            return pin(apply(one, pin(carry), args)), None
        if remat:
            body = jax.checkpoint(body, prevent_cse=False)
        return jax.lax.scan(body, h, params)[0]
    return scan


class Baseline:
    """Plain jit training step: state = (params, opt_state), both placed by ``spec``."""

    def __init__(self, config, tx, mesh, spec, batch_spec: P, remat: bool = False,
                 activations: P | None = None):
        abstract = nnx.eval_shape(lambda: config.build(nnx.Rngs(0)))
        graphdef, abs_params = nnx.split(abstract, nnx.Param)
        specs = jax.tree_util.tree_map_with_path(
            lambda path, x: NamedSharding(mesh, spec(jax.tree_util.keystr(path), x, mesh)),
            abs_params)
        self.specs = specs

        def create():
            params = nnx.state(config.build(nnx.Rngs(0)), nnx.Param)
            return params, tx.init(params)
        opt_specs = optax.tree_map_params(  # moments sharded like their parameters
            tx, lambda _, s: s, jax.eval_shape(tx.init, abs_params), specs,
            transform_non_params=lambda _: NamedSharding(mesh, P()))
        self.state = jax.jit(create, out_shardings=(specs, opt_specs))()
        self.batch_sharding = NamedSharding(mesh, batch_spec)

        constraint = None if activations is None else NamedSharding(mesh, activations)

        def loss_fn(p, batch):
            model = nnx.merge(graphdef, p)
            if not remat and constraint is None:
                return jaxsmp.losses.causal_lm_loss(model, batch)
            with jaxsmp.nn.layer_context(jaxsmp.nn.LayerContext(
                    scan_layers=_layer_scan(remat, constraint))):
                return jaxsmp.losses.causal_lm_loss(model, batch)

        def step(state, batch):
            params, opt_state = state
            loss, grads = jax.value_and_grad(loss_fn)(params, batch)
            grads = optax.clip_by_global_norm(1.0).update(grads, None)[0]
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss
        self.jitted = jax.jit(step, donate_argnums=0, out_shardings=((specs, opt_specs), None))

    def place(self, batch):
        return {"tokens": jax.device_put(batch["tokens"], self.batch_sharding)}

    def run(self, state, batch):
        return self.jitted(state, self.place(batch))

    def lower(self, state, batch):
        return self.jitted.lower(state, self.place(batch))


def fsdp_baseline(config, tx, remat=False):
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("fsdp",))
    return Baseline(config, tx, mesh, fsdp_spec, P("fsdp"), remat=remat)


def tp_baseline(config, tx, tp=2, pin_activations=False):
    """With ``pin_activations`` the activations between layers are constrained to
    [batch over fsdp, replicated over tp] (Megatron's layout); else GSPMD propagates
    from the parameter shardings alone."""
    devices = np.array(jax.devices()).reshape(-1, tp)  # tp pairs of consecutive devices
    mesh = jax.sharding.Mesh(devices, ("fsdp", "tp"))
    return Baseline(config, tx, mesh, tp_spec, P("fsdp"),
                    activations=P("fsdp", None, None) if pin_activations else None)


def dp_baseline(config, tx):
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("dp",))
    return Baseline(config, tx, mesh, lambda path, x, mesh: P(), P("dp"))


def single_baseline(config, tx):
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("one",))
    return Baseline(config, tx, mesh, lambda path, x, mesh: P(), P())


# ---------------------------------------------------------------- jaxsmp

class Ours:
    def __init__(self, config, tx, mesh, **options):
        self.state = jaxsmp.init(config.build, tx, mesh)
        self.train_step = jaxsmp.step(jaxsmp.losses.causal_lm_loss, **options)

    def run(self, state, batch):
        state, metrics = self.train_step(state, batch)
        return state, metrics["loss"]

    def lower(self, state, batch):
        return self.train_step.lower(state, batch)


# pair -> (jaxsmp label, factory, [(baseline label, factory), ...]); the ratio column
# compares the jaxsmp contender with the pair's first baseline
PAIRS = {
    "a": ("jaxsmp sdp=8", lambda c, tx: Ours(c, tx, jaxsmp.Mesh(sdp=8)),
          [("jit FSDP", lambda c, tx: fsdp_baseline(c, tx))]),
    "b": ("jaxsmp sdp=8 remat=full", lambda c, tx: Ours(c, tx, jaxsmp.Mesh(sdp=8), remat="full"),
          [("jit FSDP + checkpoint/layer", lambda c, tx: fsdp_baseline(c, tx, remat=True))]),
    "c": ("jaxsmp sdp=4,tp=2", lambda c, tx: Ours(c, tx, jaxsmp.Mesh(sdp=4, tp=2)),
          [("GSPMD TP=2 + FSDP=4", lambda c, tx: tp_baseline(c, tx)),
           ("GSPMD TP=2 + FSDP=4, activations pinned",
            lambda c, tx: tp_baseline(c, tx, pin_activations=True))]),
    "d": ("jaxsmp dp=8", lambda c, tx: Ours(c, tx, jaxsmp.Mesh(dp=8, sdp=1)),
          [("jit DP=8", lambda c, tx: dp_baseline(c, tx))]),
    "e": ("jaxsmp 1 device", lambda c, tx: Ours(c, tx, jaxsmp.Mesh(devices=jax.devices()[:1])),
          [("jit 1 device", lambda c, tx: single_baseline(c, tx))]),
    "f": ("jaxsmp sdp=8 prefetch=True", lambda c, tx: Ours(c, tx, jaxsmp.Mesh(sdp=8),
                                                           prefetch=True), []),
}


# ---------------------------------------------------------------- compiled HLO collectives
