"""HF checkpoint import edge cases: sharded files, bf16, bare base models, clear errors,
and shard-by-shard reading."""
from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from flax import nnx
from hf_models import hf_logits_and_loss, hf_model, torch, transformers
from safetensors.numpy import load_file, save_file

import jaxsmp
from jaxsmp import hf
from jaxsmp.hf.checkpoint import Checkpoint

TOKENS = np.random.default_rng(1).integers(0, 128, size=(4, 16), dtype=np.int32)


def _logits(graphdef, params, tokens=TOKENS):
    return np.asarray(jax.jit(lambda p, t: nnx.merge(graphdef, p)(t))(params, tokens))


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    model = hf_model("llama", seed=3)
    path = tmp_path_factory.mktemp("llama")
    model.save_pretrained(path)
    return model, path


def test_sharded_multi_file_checkpoint_imports(tmp_path):
    model = hf_model("llama", seed=1)
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 2
    config, graphdef, params = hf.load_params(tmp_path, jaxsmp.Mesh(sdp=4, tp=2))
    assert config.kv_heads == 2 and config.num_attention_heads == 4  # GQA
    want, _ = hf_logits_and_loss(model, TOKENS)
    np.testing.assert_allclose(_logits(graphdef, params), want, atol=1e-4, rtol=1e-4)


def test_export_multi_file_and_bf16_reload(llama_dir, tmp_path):
    model, path = llama_dir
    config, _, params = hf.load_params(path, jaxsmp.Mesh(sdp=8))
    hf.save_checkpoint(params, config, tmp_path, dtype="bfloat16", max_shard_size=50_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path,
                                                                 dtype=torch.bfloat16)
    w = reloaded.model.layers[1].self_attn.k_proj.weight
    assert w.dtype == torch.bfloat16
    want = model.model.layers[1].self_attn.k_proj.weight.detach().to(torch.bfloat16)
    assert torch.equal(w, want)


def test_bf16_checkpoint_imports_as_float32(tmp_path):
    model = hf_model("gpt_neox", seed=2).to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    _, _, params = hf.load_params(tmp_path, jaxsmp.Mesh(sdp=4, tp=2))
    kernel = params["layers"]["layers"]["attention"]["query_key_value"]["kernel"][...]
    assert kernel.dtype == np.float32
    want = model.gpt_neox.layers[1].attention.query_key_value.weight.detach().float().numpy().T
    np.testing.assert_array_equal(np.asarray(kernel[1]), want)


def test_bare_base_model_without_prefix_imports(tmp_path):
    """bigscience's Bloom checkpoints store BloomModel tensors without "transformer."."""
    model = hf_model("bloom", seed=4)
    model.transformer.save_pretrained(tmp_path)
    assert not any(k.startswith("transformer.")
                   for k in load_file(tmp_path / "model.safetensors"))
    _, graphdef, params = hf.load_params(tmp_path, jaxsmp.Mesh(sdp=8))
    want, _ = hf_logits_and_loss(model, TOKENS)
    np.testing.assert_allclose(_logits(graphdef, params), want, atol=1e-4, rtol=1e-4)


def _copy_with(src, dst, tensors=None, config=None):
    dst.mkdir()
    tensors = tensors if tensors is not None else load_file(src / "model.safetensors")
    save_file(tensors, dst / "model.safetensors")
    cfg = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, **(config or {})}))
    return dst


def test_unknown_architecture_is_rejected(llama_dir, tmp_path):
    path = _copy_with(llama_dir[1], tmp_path / "x", config={"model_type": "gpt2",
                                                            "architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(ValueError, match="unsupported Hugging Face architecture.*gpt2"):
        hf.load_params(path, jaxsmp.Mesh(sdp=8))


def test_missing_tensor_is_named(llama_dir, tmp_path):
    tensors = load_file(llama_dir[1] / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    path = _copy_with(llama_dir[1], tmp_path / "x", tensors=tensors)
    with pytest.raises(KeyError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        hf.load_params(path, jaxsmp.Mesh(sdp=8))


def test_wrong_shape_is_named(llama_dir, tmp_path):
    path = _copy_with(llama_dir[1], tmp_path / "x", config={"intermediate_size": 160})
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.gate_proj\.weight.*shape"):
        hf.load_params(path, jaxsmp.Mesh(sdp=8))


def test_unused_tensor_is_named(llama_dir, tmp_path):
    tensors = load_file(llama_dir[1] / "model.safetensors")
    tensors["model.layers.0.self_attn.q_proj.bias"] = np.zeros(64, np.float32)
    path = _copy_with(llama_dir[1], tmp_path / "x", tensors=tensors)
    with pytest.raises(ValueError, match=r"does not use.*q_proj\.bias"):
        hf.load_params(path, jaxsmp.Mesh(sdp=8))


def test_reads_only_shards_and_each_shard_once(llama_dir, monkeypatch):
    """Every read is one device's slice (never a whole sharded tensor), and dp replicas
    are copied between devices rather than read again."""
    reads: list[tuple[str, int]] = []
    original = Checkpoint.read

    def spy(self, name, index=()):
        out = original(self, name, index)
        reads.append((name, out.size))
        return out

    monkeypatch.setattr(Checkpoint, "read", spy)
    _, path = llama_dir
    hf.load_params(path, jaxsmp.Mesh(dp=2, sdp=2, tp=2))
    ckpt = Checkpoint(path)
    sizes = {n: int(np.prod(ckpt.shape(n))) for n in ckpt.names()}
    assert {n for n, _ in reads} == set(sizes)
    for name, size in reads:
        assert size <= sizes[name] // 2, (name, size, sizes[name])
    counts = {n: sum(1 for r, _ in reads if r == n) for n in sizes}
    assert max(counts.values()) <= 4  # 4 distinct (sdp x tp) shards, 8 devices
