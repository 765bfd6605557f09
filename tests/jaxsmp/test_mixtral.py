"""Mixtral: published parameter counts, causality, the router's losses by hand, dropless
grouped GEMMs against a dense per-token reference, capacity drops, training."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

import jaxsmp
from conftest import assert_causal, assert_gradients_match, sgd_update, single_device_mesh, train
from jaxsmp.models import count_params, mixtral, preset
from jaxsmp.nn import LayerContext
from jaxsmp.nn.layer_context import layer_context
from jaxsmp.nn.moe import MoE, capacity, router_stats
from jaxsmp.nn.param import is_var


@pytest.mark.parametrize("name", sorted(mixtral.PUBLISHED_PARAMS))
def test_preset_parameter_counts_match_published(name):
    assert count_params(preset("mixtral", name)) == mixtral.PUBLISHED_PARAMS[name]


def _tiny(**kw):
    return preset("mixtral", "tiny", **{"num_hidden_layers": 2, "attention_impl": "reference",
                                        **kw})


def test_forward_is_causal():
    assert_causal(jax.jit(_tiny().build(nnx.Rngs(0)).__call__))


def test_bad_router_settings_are_refused():
    with pytest.raises(ValueError, match="num_experts_per_tok 5"):
        _tiny(num_experts_per_tok=5)
    with pytest.raises(ValueError, match="capacity_factor must be > 0"):
        _tiny(capacity_factor=0.0)


def _moe(capacity_factor=None, seed=0):
    return MoE(16, 24, 4, 2, rngs=nnx.Rngs(seed), init_std=0.3,
               capacity_factor=capacity_factor)


def _dense_reference(moe: MoE, x: np.ndarray, cap: int | None = None):
    """Per token, float64: each chosen expert's SwiGLU, weighted by the softmax over the
    chosen logits; with ``cap`` an expert serves only its first ``cap`` assignments."""
    t = x.reshape(-1, x.shape[-1]).astype(np.float64)
    logits = t @ np.asarray(moe.gate.kernel[...], np.float64)
    w1, w3, w2 = (np.asarray(p[...], np.float64)
                  for p in (moe.gate_proj, moe.up_proj, moe.down_proj))
    out, served, dropped = np.zeros_like(t), np.zeros(logits.shape[1], int), 0
    for i, row in enumerate(logits):
        chosen = np.argsort(-row)[:moe.top_k]
        weights = np.exp(row[chosen] - row[chosen].max())
        weights /= weights.sum()
        for e, w in zip(chosen, weights):
            served[e] += 1
            if cap is not None and served[e] > cap:
                dropped += 1
                continue
            g, u = t[i] @ w1[e], t[i] @ w3[e]
            out[i] += w * ((g / (1 + np.exp(-g)) * u) @ w2[e])
    return out.reshape(x.shape), logits, dropped


def test_dropless_grouped_gemms_equal_a_dense_per_token_reference():
    moe = _moe()
    x = np.random.default_rng(1).normal(size=(2, 8, 16)).astype(np.float32)
    got, stats = moe(jnp.asarray(x), router_stats(1, 4, jnp.asarray(x)))
    want, _, _ = _dense_reference(moe, x)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-5)
    assert float(stats["dropped"]) == 0 and float(stats["load"].sum()) == 16 * 2


def test_capacity_factor_drops_the_latest_assignments_and_counts_them():
    moe = _moe(capacity_factor=0.5)  # 16 tokens x top-2 / 4 experts x 0.5: 4 each
    x = np.random.default_rng(2).normal(size=(2, 8, 16)).astype(np.float32)
    got, stats = moe(jnp.asarray(x), router_stats(1, 4, jnp.asarray(x)))
    want, _, dropped = _dense_reference(moe, x, cap=4)
    assert dropped > 0
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-5)
    assert float(stats["dropped"]) == dropped


def _on_expert_devices(moe: MoE, x: np.ndarray, ep: int):
    """(outputs, dropped per device) of ``moe`` on ``x`` split over ``ep`` devices by
    rows, as the step runs it: each device routes its own tokens and holds
    ``experts / ep`` experts (``LayerContext.expert_axis``)."""
    mesh = jax.make_mesh((ep,), ("ep",), devices=jax.devices()[:ep])
    graphdef, state = nnx.split(moe)
    specs = jax.tree.map(lambda v: P("ep") if v[...].ndim == 3 else P(), state,
                         is_leaf=is_var)
    state = jax.tree.map(lambda v, spec: v.replace(jax.device_put(
        v[...], NamedSharding(mesh, spec))), state, specs, is_leaf=is_var)

    def body(state, x):
        with layer_context(LayerContext(expert_axis="ep")):
            out, stats = nnx.merge(graphdef, state)(x, router_stats(1, 4, x))
        return out, stats["dropped"][None]
    run = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(specs, P("ep")),
                                out_specs=(P("ep"), P("ep"))))
    out, dropped = run(state, jax.device_put(x, NamedSharding(mesh, P("ep"))))
    return np.asarray(out), np.asarray(dropped)


@pytest.mark.parametrize("ep, capacity_factor", [(2, None), (4, None), (4, 0.5)])
def test_expert_parallel_dispatch_equals_a_dense_per_token_reference(ep, capacity_factor):
    """Tokens travel to their experts' devices and back by all-to-all: each device's
    outputs equal the dense reference on its rows (with a capacity factor, each
    device's earliest assignments kept, as without ep)."""
    moe = _moe(capacity_factor)
    x = np.random.default_rng(11).normal(size=(4, 8, 16)).astype(np.float32)
    got, dropped = _on_expert_devices(moe, x, ep)
    rows = len(x) // ep
    cap = None if capacity_factor is None else capacity(capacity_factor, rows * 8, 2, 4)
    for i in range(ep):
        want, _, drops = _dense_reference(moe, x[i * rows:(i + 1) * rows], cap)
        np.testing.assert_allclose(got[i * rows:(i + 1) * rows], want, atol=1e-5, rtol=1e-5)
        assert dropped[i] == drops
    assert (dropped.sum() > 0) == (capacity_factor is not None)


def test_router_losses_equal_a_hand_computation():
    cfg = _tiny(router_z_loss_coef=1e-3)
    model = cfg.build(nnx.Rngs(0))
    tokens = np.random.default_rng(3).integers(0, 256, (2, 8)).astype(np.int32)
    _, got = jax.jit(model.with_router_losses)(tokens)
    # the router logits of each layer, from the model's own hidden states
    layer_logits, x = [], np.asarray(model.embed_tokens(tokens))
    cos, sin = jaxsmp.nn.rotary_for_tokens(tokens, cfg.head_dim, cfg.rope_theta,
                                           cfg.max_position_embeddings)
    graphdef, stacked = nnx.split(model.layers.layers)
    stats = router_stats(2, 4, jnp.asarray(x))
    for i in range(2):
        layer = nnx.merge(graphdef, jax.tree.map(lambda a: a[i], stacked))
        h = x + np.asarray(layer.self_attn(layer.input_layernorm(x), cos, sin))
        moe_in = np.asarray(layer.post_attention_layernorm(h)).reshape(-1, cfg.hidden_size)
        layer_logits.append(moe_in.astype(np.float64)
                            @ np.asarray(layer.block_sparse_moe.gate.kernel[...], np.float64))
        x = np.asarray(layer((jnp.asarray(x), stats), cos, sin)[0])
    logits = np.concatenate(layer_logits)                    # [layers * tokens, experts]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    top2 = np.argsort(-logits, axis=-1)[:, :2]
    chose = np.zeros_like(probs)
    np.put_along_axis(chose, top2, 1.0, axis=-1)
    want_aux = 4 * np.sum(chose.mean(0) * probs.mean(0))     # E * sum_e f_e * P_e
    lse = np.log(np.exp(logits).sum(-1))
    np.testing.assert_allclose(float(got["aux_loss"]), want_aux, rtol=1e-5)
    np.testing.assert_allclose(float(got["z_loss"]), np.mean(lse ** 2), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(got["expert_load"]),
                               chose.reshape(2, 16, 4).sum(1) / (16 * 2))


def test_trainer_loss_adds_weighted_router_losses():
    cfg = _tiny(router_aux_loss_coef=0.5, router_z_loss_coef=0.25)
    model = cfg.build(nnx.Rngs(0))
    tokens = np.random.default_rng(4).integers(0, 256, (2, 8)).astype(np.int32)
    loss, metrics = jaxsmp.losses.causal_lm_loss(model, {"tokens": tokens})
    want = metrics["lm_loss"] + 0.5 * metrics["aux_loss"] + 0.25 * metrics["z_loss"]
    np.testing.assert_allclose(float(loss), float(want), rtol=1e-6)


def test_single_device_training_descends_and_logs_router_metrics():
    tokens = np.random.default_rng(5).integers(0, 256, (4, 16)).astype(np.int32)
    state = jaxsmp.init(_tiny().build, optax.adamw(3e-3), single_device_mesh(), seed=0)
    step = jaxsmp.step(jaxsmp.losses.causal_lm_loss)
    losses = []
    for _ in range(5):
        state, metrics = step(state, {"tokens": tokens})
        losses.append(float(metrics["loss"]))
    assert losses[-1] < losses[0] - 0.1, losses
    assert metrics["expert_load"].shape == (2, 4)
    np.testing.assert_allclose(np.asarray(metrics["expert_load"]).sum(1), 1.0, rtol=1e-6)
    assert float(metrics["aux_loss"]) > 0


def test_trains_on_sharded_mesh():
    tokens = np.random.default_rng(6).integers(0, 256, (8, 16)).astype(np.int32)
    state, losses = train(_tiny(), jaxsmp.Mesh(sdp=4, tp=2), tokens, steps=4,
                          tx=lambda: optax.adamw(3e-3))
    w = state.params["layers"]["layers"]["block_sparse_moe"]["gate_proj"][...]
    assert w.shape == (2, 4, 128, 256) and "tp" in str(w.sharding.spec)
    assert losses[-1] < losses[0] - 0.1, losses


SLOW = pytest.mark.slow


@pytest.mark.parametrize("shape, options, model", [
    (dict(sdp=4, tp=2), {}, {}), (dict(dp=2, sdp=4), {}, {}),
    (dict(sdp=4, tp=2), dict(microbatches=2), {}),
    # expert parallelism: experts split over ep, tokens moved by all-to-all
    (dict(ep=2, sdp=4), {}, {}),
    pytest.param(dict(ep=4, tp=2), {}, {}, marks=SLOW),
    pytest.param(dict(ep=8), {}, dict(num_local_experts=8), marks=SLOW),
    pytest.param(dict(ep=2, sdp=4), dict(microbatches=2), {}, marks=SLOW),
    # pipelines (GPipe, circular): the router statistics travel with their microbatch
    pytest.param(dict(ep=2, pp=2, sdp=2), dict(microbatches=2), {}, marks=SLOW),
    pytest.param(dict(pp=2, sdp=4), dict(microbatches=2, pipeline="virtual"),
                 dict(num_hidden_layers=4), marks=SLOW),
], ids=["sdp4-tp2", "dp2-sdp4", "sdp4-tp2-microbatches2", "ep2-sdp4", "ep4-tp2", "ep8",
        "ep2-sdp4-microbatches2", "ep2-pp2-sdp2-simple", "pp2-sdp4-virtual"])
def test_full_step_on_a_sharded_mesh_equals_one_device(shape, options, model):
    """SGD at lr 1000, update applied: every parameter's update and grad_norm equal one
    device's, with the load-balancing loss (over the global batch's statistics) and the
    z-loss on. With microbatches outside a pipeline the load-balancing loss is off: each
    microbatch's is over its own tokens (as Megatron and MaxText compute it), not the
    whole batch's; a pipeline sums the microbatches' statistics."""
    micro = options.get("microbatches", 1)
    per_microbatch = micro > 1 and shape.get("pp", 1) == 1
    cfg = _tiny(router_aux_loss_coef=0.0 if per_microbatch else 0.1, router_z_loss_coef=1e-2,
                **model)
    tokens = np.random.default_rng(7).integers(0, 256, (8 * micro, 16)).astype(np.int32)
    want = sgd_update(cfg, single_device_mesh(), tokens, loss=_scalar_metrics_loss)
    got = sgd_update(cfg, jaxsmp.Mesh(**shape), tokens, loss=_scalar_metrics_loss, **options)
    assert_gradients_match(got, want)
    for key in ("z_loss", "lm_loss", "balance") + (() if per_microbatch else ("aux_loss",)):
        np.testing.assert_allclose(got[1][key], want[1][key], rtol=1e-5, err_msg=key)


@SLOW
def test_capacity_factor_with_ep_drops_what_the_same_data_split_drops_without_it():
    """Capacity is per data device's tokens with or without ep: ep=2, sdp=4 and dp=2,
    sdp=4 (one sequence a device) drop the same assignments and take the same step."""
    cfg = _tiny(capacity_factor=0.5, router_z_loss_coef=1e-2)
    tokens = np.random.default_rng(12).integers(0, 256, (8, 16)).astype(np.int32)
    want = sgd_update(cfg, jaxsmp.Mesh(dp=2, sdp=4), tokens, loss=_scalar_metrics_loss)
    got = sgd_update(cfg, jaxsmp.Mesh(ep=2, sdp=4), tokens, loss=_scalar_metrics_loss)
    assert want[1]["dropped_tokens"] > 0
    assert got[1]["dropped_tokens"] == want[1]["dropped_tokens"]
    assert_gradients_match(got, want)


def _scalar_metrics_loss(model, batch):
    """The trainer's loss; the expert load reduced to a scalar (``sgd_update`` takes
    scalar metrics) linearly, so that its mean over data shards is the batch's."""
    loss, metrics = jaxsmp.losses.causal_lm_loss(model, batch)
    load = metrics.pop("expert_load")
    return loss, {**metrics, "balance": jnp.sum(load * jnp.arange(load.size).reshape(
        load.shape))}


def test_sharded_load_balancing_loss_is_the_global_batchs():
    """The sharded step's load-balancing loss is the global batch's (statistics summed
    over the data devices), not the mean of each device's (here one sequence a device)."""
    cfg = _tiny()
    tokens = np.random.default_rng(8).integers(0, 256, (8, 16)).astype(np.int32)
    state = jaxsmp.init(cfg.build, optax.sgd(1.0), jaxsmp.Mesh(dp=2, sdp=4), seed=0)
    got = float(jaxsmp.eval_step(_scalar_metrics_loss)(state, {"tokens": tokens})["aux_loss"])
    model = nnx.merge(state.graphdef, jax.device_get(state.params))
    aux = jax.jit(lambda t: model.with_router_losses(t)[1]["aux_loss"])
    np.testing.assert_allclose(got, float(aux(tokens)), rtol=1e-5)
    per_shard = np.mean([float(aux(tokens[i:i + 1])) for i in range(8)])
    assert abs(got - per_shard) > 1e-4  # what each device's own tokens would give


@pytest.mark.parametrize("shape, options, feature", [
    (dict(sdp=4, cp=2), {}, r"context parallelism \(cp > 1\)"),
    (dict(ep=2, pp=2, sdp=2), dict(pipeline="interleaved", microbatches=2),
     r"1F1B \(pipeline='interleaved'\)"),
    (dict(sdp=4, tp=2), dict(sequence_parallel=True), "sequence_parallel"),
], ids=["cp2", "ep2-pp2-interleaved", "sequence-parallel"])
def test_what_cannot_carry_router_statistics_yet_is_refused(shape, options, feature):
    tokens = np.random.default_rng(9).integers(0, 256, (8, 16)).astype(np.int32)
    state = jaxsmp.init(_tiny().build, optax.sgd(0.1), jaxsmp.Mesh(**shape), seed=0)
    with pytest.raises(ValueError, match=f"{feature} runs stacked layers whose carry is one "
                                         "hidden-state array.*does not support yet"):
        jaxsmp.step(jaxsmp.losses.causal_lm_loss, **options)(state, {"tokens": tokens})


def test_fp8_is_refused_for_the_experts():
    tokens = np.random.default_rng(10).integers(0, 256, (2, 16)).astype(np.int32)
    state = jaxsmp.init(_tiny().build, optax.sgd(0.1), single_device_mesh(), seed=0)
    with pytest.raises(ValueError, match="precision='fp8' has no float8 grouped GEMM"):
        jaxsmp.step(jaxsmp.losses.causal_lm_loss, precision="fp8")(state, {"tokens": tokens})


def test_expert_parallelism_needs_experts_it_divides():
    """Refused before compiling: ep that does not divide the expert count, ep on a dense
    model (it would only be data parallelism; the error says what is)."""
    with pytest.raises(ValueError, match=r"'experts' of size 4 is not divisible by mesh "
                                         r"axes \('ep',\) \(degree 8\)"):
        jaxsmp.init(_tiny().build, optax.sgd(0.1), jaxsmp.Mesh(ep=8), seed=0)
    dense = preset("llama", "tiny", num_hidden_layers=2)
    with pytest.raises(ValueError, match=r"ep=2 splits a mixture of experts' experts.*a dense "
                                         r"model has no experts.*sdp=8 or dp=2"):
        jaxsmp.init(dense.build, optax.sgd(0.1), jaxsmp.Mesh(ep=2, sdp=4), seed=0)


@pytest.mark.parametrize("target", [dict(ep=4, tp=2), dict(sdp=8)], ids=["ep4-tp2", "sdp8"])
def test_checkpoint_saved_with_experts_over_ep_restores_onto_another_ep(target, tmp_path):
    from jaxsmp.checkpoint import abstract_state
    cfg, tx = _tiny(), optax.adamw(1e-3)
    state = jaxsmp.init(cfg.build, tx, jaxsmp.Mesh(ep=2, sdp=4), seed=3)
    w = state.params["layers"]["layers"]["block_sparse_moe"]["gate_proj"]
    assert w.get_metadata()["mesh_axes"][1] == "ep"
    jaxsmp.save(tmp_path, state)
    mesh = jaxsmp.Mesh(**target)
    restored = jaxsmp.restore(tmp_path, abstract_state(cfg.build, tx, mesh))
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
        assert got.dtype == want.dtype and np.array_equal(np.asarray(got), np.asarray(want))
    w = restored.params["layers"]["layers"]["block_sparse_moe"]["gate_proj"]
    assert ("ep" in str(w[...].sharding.spec)) == (mesh.ep > 1)
