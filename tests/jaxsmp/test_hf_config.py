"""HF config.json <-> jaxsmp configs (no torch needed)."""
from __future__ import annotations

import pytest

from jaxsmp import hf
from jaxsmp.models import FAMILIES, preset


@pytest.mark.parametrize("family", ["gpt_neox", "bloom", "llama", "mixtral"])
def test_round_trip_of_every_preset(family):
    for name in FAMILIES[family]:
        cfg = preset(family, name)
        got_family, got = hf.from_hf_config(hf.to_hf_config(cfg))
        assert got_family == family and got == cfg, name


def test_legacy_gpt_neox_rotary_keys():
    legacy = {"model_type": "gpt_neox", "vocab_size": 50304, "hidden_size": 512,
              "num_hidden_layers": 6, "num_attention_heads": 8, "intermediate_size": 2048,
              "rotary_pct": 0.5, "rotary_emb_base": 5000, "use_parallel_residual": False}
    _, cfg = hf.from_hf_config(legacy)
    assert (cfg.rotary_pct, cfg.rotary_emb_base, cfg.use_parallel_residual) == (0.5, 5000,
                                                                                False)


def test_llama_rope_theta_in_either_place():
    base = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 512,
            "num_hidden_layers": 2, "num_attention_heads": 8, "intermediate_size": 1024}
    assert hf.from_hf_config({**base, "rope_theta": 5e5})[1].rope_theta == 5e5
    new = {**base, "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}}
    assert hf.from_hf_config(new)[1].rope_theta == 1e6


@pytest.mark.parametrize("change, match", [
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "rope_type='llama3'"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"head_dim": 128}, "head_dim=128"),
])
def test_unsupported_llama_variants_are_rejected(change, match):
    base = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 512,
            "num_hidden_layers": 2, "num_attention_heads": 8, "intermediate_size": 1024}
    with pytest.raises(ValueError, match=match):
        hf.from_hf_config({**base, **change})


def test_unknown_architecture_is_named():
    with pytest.raises(ValueError, match="model_type='mistral'"):
        hf.from_hf_config({"model_type": "mistral", "architectures": ["MistralForCausalLM"]})


def test_missing_config_json(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        hf.load_config(tmp_path)


@pytest.mark.parametrize("family, missing", [("gpt_neox", "vocab_size"), ("llama", "hidden_size"),
                                             ("bloom", "n_head")])
def test_missing_field_names_the_field_and_the_file(tmp_path, family, missing):
    import json
    config = hf.to_hf_config(preset(family, "tiny"))
    aliases = {"n_head": ("n_head", "num_attention_heads")}  # Bloom takes either name
    for key in aliases.get(missing, (missing,)):
        config.pop(key, None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=rf"config.json: {family} config is missing the "
                                         rf"required field '{missing}'"):
        hf.load_config(tmp_path)


@pytest.mark.parametrize("change", [dict(capacity_factor=1.25), dict(attention_bias=True)])
def test_mixtral_export_refuses_what_hf_cannot_express(change):
    key = next(iter(change))
    with pytest.raises(ValueError, match=f"mixtral {key}=.* has no Hugging Face"):
        hf.to_hf_config(preset("mixtral", "tiny", **change))


def test_mixtral_sliding_window_is_rejected():
    cfg = hf.to_hf_config(preset("mixtral", "tiny"))
    with pytest.raises(ValueError, match="sliding_window=4096"):
        hf.from_hf_config({**cfg, "sliding_window": 4096})
