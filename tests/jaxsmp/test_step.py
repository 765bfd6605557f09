"""@jaxsmp.step: microbatching, loss scaling, remat, metrics, recompilation, bad input."""
import hlo
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxsmp
from conftest import (
    assert_gradients_match,
    compiled_programs,
    gradients,
    leaves,
    single_device_mesh,
    train,
)
from jaxsmp.losses import causal_lm_loss
from jaxsmp.train.precision import LossScale


def sgd():
    return optax.sgd(1.0)


def test_microbatches_give_the_gradients_of_one_batch(tiny_config, tokens):
    # With SGD(lr=1) and no clipping, parameter change == -gradient.
    mesh = jaxsmp.Mesh(sdp=4, tp=2)
    init = leaves(jaxsmp.init(tiny_config.build, sgd(), mesh))
    one, _ = train(tiny_config, mesh, tokens, steps=1, tx=sgd, clip_norm=None)
    four, _ = train(tiny_config, mesh, tokens, steps=1, tx=sgd, clip_norm=None, microbatches=4)
    for p0, a, b in zip(init, leaves(one), leaves(four)):
        np.testing.assert_allclose(p0 - b, p0 - a, atol=2e-6, rtol=1e-4)


@pytest.mark.parametrize("policy", ["full", "save_qkv", "save_matmuls"])
def test_remat_policies_keep_gradients(tiny_config, tokens, policy):
    mesh = jaxsmp.Mesh(sdp=8)
    base, _ = train(tiny_config, mesh, tokens, steps=1, tx=sgd, clip_norm=None)
    remat, _ = train(tiny_config, mesh, tokens, steps=1, tx=sgd, clip_norm=None, remat=policy)
    for a, b in zip(leaves(base), leaves(remat)):
        np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("family", ["llama", "gpt_neox", "bloom"])
def test_save_qkv_recomputes_all_but_the_q_k_v_projections(tokens, family):
    """The compiled step with ``remat="save_qkv"`` runs, per layer, the FLOPs of ``full``
    less one forward of the q, k, v projections (their outputs kept; XLA's cost analysis
    counts the scanned layer once), and keeps the gradients of ``none``."""
    layers = {"n_layer": 2} if family == "bloom" else {"num_hidden_layers": 2}
    config = jaxsmp.models.preset(family, "tiny", attention_impl="reference", **layers)
    mesh = jaxsmp.Mesh(sdp=8)
    state = jaxsmp.init(config.build, sgd(), mesh, seed=0)
    flops = {r: jaxsmp.step(causal_lm_loss, remat=r, clip_norm=None).lower(
        state, {"tokens": tokens}).compile().cost_analysis()["flops"]
        for r in ("none", "save_qkv", "full")}
    qkv = 2 * tokens.size // 8 * jaxsmp.plan.Workload(config, 32).layer_qkv_params
    assert flops["none"] < flops["save_qkv"] < flops["full"]
    assert flops["full"] - flops["save_qkv"] == pytest.approx(qkv, rel=0.02)
    base, _ = train(config, mesh, tokens, steps=1, tx=sgd, clip_norm=None)
    kept, _ = train(config, mesh, tokens, steps=1, tx=sgd, clip_norm=None, remat="save_qkv")
    for a, b in zip(leaves(base), leaves(kept)):
        np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("family", ["llama", "gpt_neox", "bloom"])
def test_remat_recomputes_the_gemms_the_planner_counts(tokens, family):
    """``full`` and ``save_qkv`` run again, beyond ``save_matmuls`` (which recomputes no
    GEMM of a dense layer), the share of a layer's forward GEMMs that
    ``Workload.recomputed_share`` counts in JAX's program: not the projections whose
    outputs only the residual sum reads (GPT-NeoX: 7/12, Bloom: 2/3; XLA's cost
    analysis counts the scanned layer once)."""
    layers = {"n_layer": 2} if family == "bloom" else {"num_hidden_layers": 2}
    config = jaxsmp.models.preset(family, "tiny", attention_impl="reference", **layers)
    state = jaxsmp.init(config.build, sgd(), jaxsmp.Mesh(sdp=8), seed=0)
    flops = {r: jaxsmp.step(causal_lm_loss, remat=r, clip_norm=None).lower(
        state, {"tokens": tokens}).compile().cost_analysis()["flops"]
        for r in ("save_matmuls", "save_qkv", "full")}
    workload = jaxsmp.plan.Workload(config, 32)
    forward = 2 * tokens.size // 8 * workload.layer_matmul_params
    for policy in ("full", "save_qkv"):
        share = workload.recomputed_share(policy)
        assert flops[policy] - flops["save_matmuls"] == pytest.approx(share * forward, rel=0.02)
    # not run again: the MLP's output projection, and GPT-NeoX's attention output too
    width = config.hidden_size
    mlp = 4 * width if family == "bloom" else config.intermediate_size
    skipped = mlp * width + (width * width if family == "gpt_neox" else 0)
    assert workload.recomputed_share("full") == pytest.approx(
        1 - skipped / workload.layer_matmul_params)


def test_offload_raises_where_the_compiled_step_keeps_nothing_on_the_host(tiny_config, tokens):
    # XLA:CPU accepts the offload policy and drops it when compiling (no S(5) buffer)
    assert jax.default_backend() == "cpu"
    with pytest.raises(ValueError, match=r"remat='offload'.*keeps no buffer in host memory"):
        train(tiny_config, jaxsmp.Mesh(sdp=8), tokens, steps=1, remat="offload")


@pytest.mark.parametrize("degrees", [dict(sdp=4, tp=2), dict(dp=8, sdp=1)],
                         ids=["sdp4-tp2", "dp8"])
def test_bf16_compute_tracks_fp32(tiny_config, tokens, degrees):
    mesh = jaxsmp.Mesh(**degrees)
    _, fp32 = train(tiny_config, mesh, tokens, steps=2)
    state, bf16 = train(tiny_config, mesh, tokens, steps=2, precision="bf16")
    np.testing.assert_allclose(bf16, fp32, rtol=2e-2)
    assert not np.allclose(bf16, fp32, rtol=1e-5)  # the rounding is there
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.params))  # master copy


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_bf16_matmuls_are_in_the_compiled_step(tiny_config, tokens, precision):
    # XLA:CPU computes a bf16 matmul as a float32 dot of bf16 inputs: every dot of the
    # bf16 step reads bf16 values, no dot of the float32 step does
    state = jaxsmp.init(tiny_config.build, optax.adamw(1e-3), jaxsmp.Mesh(sdp=4, tp=2))
    text = jaxsmp.step(causal_lm_loss, precision=precision).lower(
        state, {"tokens": tokens}).compile().as_text()
    dots = hlo.dot_input_dtypes(text)
    assert dots
    assert all(("bf16" in d) == (precision == "bf16") for d in dots), dots


@pytest.mark.parametrize("degrees", [dict(sdp=8), dict(dp=2, sdp=2, tp=2)],
                         ids=["sdp8", "dp2-sdp2-tp2"])
def test_bf16_gradient_reduction_matches_one_device_within_bf16_rounding(tiny_config, tokens,
                                                                         degrees):
    # reduce_dtype="bf16": the gradients travel through the reduce-scatter (and the dp
    # all-reduce) in bfloat16: within 1e-2 of the single-device float32 gradients, where
    # float32 reduction keeps 1e-5 (conftest), and visibly rounded
    want = gradients(tiny_config, single_device_mesh(), tokens, microbatches=2)
    got = gradients(tiny_config, jaxsmp.Mesh(**degrees), tokens, microbatches=2,
                    reduce_dtype="bf16")
    assert_gradients_match(got, want, rtol=1e-2)
    with pytest.raises(AssertionError, match="gradient of parameter"):
        assert_gradients_match(got, want)


def test_fp16_overflow_skips_the_step_and_keeps_parameters(tiny_config, tokens):
    mesh = jaxsmp.Mesh(sdp=8)
    state = jaxsmp.init(tiny_config.build, optax.adamw(1e-3), mesh,
                        loss_scale=LossScale.create(initial=2.0 ** 24))  # overflows fp16
    before = leaves(state)
    train_step = jaxsmp.step(causal_lm_loss, precision="fp16")
    state, metrics = train_step(state, {"tokens": tokens})
    assert int(metrics["skipped"]) == 1
    assert float(metrics["loss_scale"]) == 2.0 ** 23
    for a, b in zip(before, leaves(state)):
        np.testing.assert_array_equal(a, b)
    for _ in range(20):  # the scale halves until gradients are finite, then it trains
        state, metrics = train_step(state, {"tokens": tokens})
        if not int(metrics["skipped"]):
            break
    assert int(metrics["skipped"]) == 0 and float(metrics["loss_scale"]) < 2.0 ** 23
    assert any(not np.array_equal(a, b) for a, b in zip(before, leaves(state)))


def test_metrics_and_no_recompilation(tiny_config, tokens):
    mesh = jaxsmp.Mesh(sdp=4, tp=2)
    tx = optax.inject_hyperparams(optax.adamw)(learning_rate=3e-4)
    state = jaxsmp.init(tiny_config.build, tx, mesh)
    train_step = jaxsmp.step(causal_lm_loss)
    with compiled_programs() as first:
        state, metrics = train_step(state, {"tokens": tokens})
    with compiled_programs() as later:
        for _ in range(2):
            state, metrics = train_step(state, {"tokens": tokens})
    assert set(metrics) >= {"loss", "grad_norm", "learning_rate", "skipped"}
    assert float(metrics["learning_rate"]) == pytest.approx(3e-4)
    assert first.count("jit(_step)") == 1 and later == []
    assert int(state.step) == 3


def test_user_metrics_and_eval_step(tiny_config, tokens):
    mesh = jaxsmp.Mesh(dp=2, sdp=4)

    def loss_with_metrics(model, batch):
        loss = causal_lm_loss(model, batch)
        return loss, {"twice": 2 * loss}  # metrics are averaged over devices

    state = jaxsmp.init(tiny_config.build, optax.adamw(1e-3), mesh)
    evaluate = jaxsmp.eval_step(loss_with_metrics)
    before = evaluate(state, {"tokens": tokens})
    state, metrics = jaxsmp.step(loss_with_metrics)(state, {"tokens": tokens})
    assert float(metrics["twice"]) == pytest.approx(2 * float(metrics["loss"]), rel=1e-5)
    np.testing.assert_allclose(float(before["loss"]), float(metrics["loss"]), rtol=1e-5)
    assert float(evaluate(state, {"tokens": tokens})["loss"]) < float(before["loss"])


def test_batch_not_divisible_names_the_sizes(tiny_config, tokens):
    state = jaxsmp.init(tiny_config.build, optax.adamw(1e-3), jaxsmp.Mesh(dp=2, sdp=4))
    train_step = jaxsmp.step(causal_lm_loss, microbatches=4)
    with pytest.raises(ValueError, match=r"global batch size 16 .* \(8\) x microbatches \(4\) = 32"):
        train_step(state, {"tokens": tokens})


def test_bad_step_options():
    with pytest.raises(ValueError, match=r"unknown precision 'fp4'; valid: \['bf16', 'fp16', "
                                         r"'fp32', 'fp8'\]"):
        jaxsmp.step(causal_lm_loss, precision="fp4")
    with pytest.raises(ValueError, match=r"fp8_history must be a positive integer, got 0"):
        jaxsmp.step(causal_lm_loss, precision="fp8", fp8_history=0)
    with pytest.raises(ValueError, match=r"fp8_history=16 needs precision='fp8'"):
        jaxsmp.step(causal_lm_loss, precision="bf16", fp8_history=16)
    with pytest.raises(ValueError, match=r"unknown remat policy 'some'"):
        jaxsmp.step(causal_lm_loss, remat="some")
    with pytest.raises(ValueError, match=r"microbatches must be a positive integer, got 0"):
        jaxsmp.step(causal_lm_loss, microbatches=0)
    for bad in (0, -1.0, "1"):
        with pytest.raises(ValueError, match=rf"clip_norm must be a positive number or None "
                                             rf"\(no clipping\), got {bad!r}"):
            jaxsmp.step(causal_lm_loss, clip_norm=bad)
    with pytest.raises(ValueError, match=r"unknown collectives algorithm 'nccl'; valid: "):
        jaxsmp.step(causal_lm_loss, collectives="nccl")
    with pytest.raises(ValueError, match=r"unknown reduce_dtype 'fp16'; valid: \('fp32', 'bf16'\)"):
        jaxsmp.step(causal_lm_loss, reduce_dtype="fp16")


@pytest.mark.parametrize("tokens_fn, match", [
    (lambda t: _set(t, (3, 5), 256),
     r"token id 256 at batch\['tokens'\]\[3, 5\] is outside the model's vocabulary \[0, 256\)"),
    (lambda t: _set(t, (0, 0), -1), r"token id -1 at batch\['tokens'\]\[0, 0\]"),
    (lambda t: t.reshape(-1), r"batch\['tokens'\] must be integer ids of shape \[batch, seq\], "
                              r"got int32\[512\]"),
    (lambda t: t.astype(np.float32), r"must be integer ids .* got float32\[16, 32\]"),
])
def test_bad_tokens_fail_before_compiling(tiny_config, tokens, tokens_fn, match):
    state = jaxsmp.init(tiny_config.build, optax.sgd(0.1), jaxsmp.Mesh(sdp=8))
    train_step = jaxsmp.step(causal_lm_loss)
    with compiled_programs() as compiled:
        with pytest.raises(ValueError, match=match):
            train_step(state, {"tokens": tokens_fn(tokens)})
        with pytest.raises(ValueError, match=match):
            jaxsmp.eval_step(causal_lm_loss)(state, {"tokens": tokens_fn(tokens)})
    assert not {"jit(_step)", "jit(_eval)"} & set(compiled)  # nothing was compiled


def _set(tokens, index, value):
    out = tokens.copy()
    out[index] = value
    return out
