"""Logits and loss of imported HF models match transformers; exports reload in transformers.

Tolerance: float32 logits within atol 1e-4 (plus rtol 1e-4), losses within 1e-5.
"""
from __future__ import annotations

import jax
import numpy as np
import pytest
from flax import nnx
from hf_models import hf_logits_and_loss, hf_model, torch, transformers

import jaxsmp
from jaxsmp import hf, losses

FAMILIES = ["gpt_neox", "bloom", "llama", "mixtral"]
ATOL = RTOL = 1e-4


@pytest.fixture(scope="module")
def tokens():
    return np.random.default_rng(0).integers(0, 128, size=(8, 32), dtype=np.int32)


@pytest.fixture(scope="module", params=FAMILIES)
def saved(request, tmp_path_factory):
    family = request.param
    model = hf_model(family)
    path = tmp_path_factory.mktemp(family)
    model.save_pretrained(path)
    return family, model, path


def _logits(graphdef, params, tokens):
    return np.asarray(jax.jit(lambda p, t: nnx.merge(graphdef, p)(t))(params, tokens))


@pytest.mark.parametrize("mesh_shape", [dict(sdp=4, tp=2), dict(dp=2, sdp=2, tp=2)])
def test_import_logits_and_loss_match(saved, tokens, mesh_shape):
    family, model, path = saved
    want_logits, want_loss = hf_logits_and_loss(model, tokens)
    mesh = jaxsmp.Mesh(**mesh_shape)
    config, graphdef, params = hf.load_params(path, mesh)
    assert hf.family_of(config) == family
    got = _logits(graphdef, params, tokens)
    np.testing.assert_allclose(got, want_logits, atol=ATOL, rtol=RTOL)
    loss = float(losses.next_token_loss(got, tokens))
    assert abs(loss - want_loss) < 1e-5
    kernel = jax.tree.leaves(params)[0]
    assert len(kernel.sharding.device_set) == 8


def test_export_reloads_in_transformers(saved, tokens, tmp_path):
    family, model, path = saved
    want_logits, _ = hf_logits_and_loss(model, tokens)
    config, _, params = hf.load_params(path, jaxsmp.Mesh(sdp=4, tp=2))
    hf.save_checkpoint(params, config, tmp_path)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    got, _ = hf_logits_and_loss(reloaded, tokens)
    np.testing.assert_allclose(got, want_logits, atol=ATOL, rtol=RTOL)


def test_trainer_state_from_hf_evaluates_hf_loss(saved, tokens):
    """init_from_hf gives a TrainState whose sharded eval step reproduces HF's loss."""
    family, model, path = saved
    _, want_loss = hf_logits_and_loss(model, tokens)
    import optax
    state, config = hf.init_from_hf(path, optax.adamw(1e-3), jaxsmp.Mesh(sdp=4, tp=2),
                                    attention_impl="reference")
    assert config.attention_impl == "reference"
    evaluate = jaxsmp.eval_step(lambda m, b: losses.next_token_loss(m(b["tokens"]),
                                                                    b["tokens"]))
    loss = float(evaluate(state, {"tokens": tokens})["loss"])
    assert abs(loss - want_loss) < 1e-5


@pytest.mark.parametrize("family, variant", [
    ("gpt_neox", dict(use_parallel_residual=False)),
    ("bloom", dict(apply_residual_connection_post_layernorm=True)),
    ("bloom", dict(hidden_size=96, n_head=6)),  # ALiBi slopes for a non-power-of-two
    ("llama", dict(tie_word_embeddings=True)),
], ids=["neox-sequential", "bloom-post-ln-residual", "bloom-6-heads", "llama-tied"])
def test_architecture_variants_match(family, variant, tokens, tmp_path):
    model = hf_model(family, seed=7, **variant)
    model.save_pretrained(tmp_path)
    want_logits, want_loss = hf_logits_and_loss(model, tokens)
    config, graphdef, params = hf.load_params(tmp_path, jaxsmp.Mesh(sdp=8))
    for key, value in variant.items():
        assert getattr(config, key) == value
    got = _logits(graphdef, params, tokens)
    np.testing.assert_allclose(got, want_logits, atol=ATOL, rtol=RTOL)
    assert abs(float(losses.next_token_loss(got, tokens)) - want_loss) < 1e-5


def test_mixtral_import_and_export_on_one_device(tokens, tmp_path):
    """GQA, 4 experts, top-2: logits, loss and the load-balancing loss equal
    transformers' (its ``aux_loss`` with ``output_router_logits``); the export reloads."""
    model = hf_model("mixtral", seed=8)
    model.save_pretrained(tmp_path / "hf")
    want_logits, want_loss = hf_logits_and_loss(model, tokens)
    mesh = jaxsmp.Mesh(sdp=1, devices=jax.devices()[:1])
    config, graphdef, params = hf.load_params(tmp_path / "hf", mesh)
    assert (config.num_local_experts, config.num_experts_per_tok, config.kv_heads) == (4, 2, 2)
    logits, router = jax.jit(lambda p, t: nnx.merge(graphdef, p).with_router_losses(t))(
        params, tokens)
    np.testing.assert_allclose(np.asarray(logits), want_logits, atol=ATOL, rtol=RTOL)
    assert abs(float(losses.next_token_loss(logits, tokens)) - want_loss) < 1e-5
    with torch.no_grad():
        hf_aux = float(model(input_ids=torch.as_tensor(tokens, dtype=torch.long),
                             output_router_logits=True).aux_loss)
    np.testing.assert_allclose(float(router["aux_loss"]), hf_aux, rtol=1e-5)
    hf.save_checkpoint(params, config, tmp_path / "out")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    np.testing.assert_allclose(hf_logits_and_loss(reloaded, tokens)[0], want_logits,
                               atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("mesh_shape", [dict(ep=2, sdp=4), dict(ep=4, tp=2)],
                         ids=["ep2-sdp4", "ep4-tp2"])
def test_mixtral_on_expert_parallel_meshes_matches_transformers(tokens, tmp_path, mesh_shape):
    """Imported onto a mesh with the experts split over ep: the logits equal
    transformers', and so does the sharded eval step's loss, whose compiled program sends
    the tokens to their experts by all-to-all; the export reloads in transformers."""
    import optax
    model = hf_model("mixtral", seed=8)
    model.save_pretrained(tmp_path / "hf")
    want_logits, want_loss = hf_logits_and_loss(model, tokens)
    mesh = jaxsmp.Mesh(**mesh_shape)
    config, graphdef, params = hf.load_params(tmp_path / "hf", mesh)
    experts = params["layers"]["layers"]["block_sparse_moe"]["gate_proj"][...]
    assert experts.sharding.spec[1] == "ep"
    np.testing.assert_allclose(_logits(graphdef, params, tokens), want_logits,
                               atol=ATOL, rtol=RTOL)
    state, _ = hf.init_from_hf(tmp_path / "hf", optax.sgd(0.1), mesh,
                               attention_impl="reference")
    evaluate = jaxsmp.eval_step(lambda m, b: losses.next_token_loss(m(b["tokens"]),
                                                                    b["tokens"]))
    batch = {"tokens": tokens}
    assert abs(float(evaluate(state, batch)["loss"]) - want_loss) < 1e-5
    assert "all-to-all" in evaluate.lower(state, batch).compile().as_text()
    hf.save_checkpoint(params, config, tmp_path / "out")
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    np.testing.assert_allclose(hf_logits_and_loss(reloaded, tokens)[0], want_logits,
                               atol=ATOL, rtol=RTOL)
