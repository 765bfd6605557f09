"""Tiny random Hugging Face models built locally (no hub), for the parity tests."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="parity tests need torch (pip install .[parity])")
transformers = pytest.importorskip(
    "transformers", reason="parity tests need transformers (pip install .[parity])")

VOCAB, HIDDEN, LAYERS, HEADS = 128, 64, 2, 4


def hf_config(family: str, **overrides):
    if family == "gpt_neox":
        cfg = transformers.GPTNeoXConfig(
            vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
            num_attention_heads=HEADS, intermediate_size=4 * HIDDEN,
            max_position_embeddings=64, rotary_pct=0.5, use_parallel_residual=True)
    elif family == "bloom":
        cfg = transformers.BloomConfig(vocab_size=VOCAB, hidden_size=HIDDEN, n_layer=LAYERS,
                                       n_head=HEADS)
    elif family == "mixtral":  # GQA, 4 experts, top-2
        cfg = transformers.MixtralConfig(
            vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
            num_attention_heads=HEADS, num_key_value_heads=2, intermediate_size=96,
            num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
            rms_norm_eps=1e-5)
    else:
        cfg = transformers.LlamaConfig(
            vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
            num_attention_heads=HEADS, num_key_value_heads=2, intermediate_size=176,
            max_position_embeddings=64, rms_norm_eps=1e-5)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


CLASSES = {"gpt_neox": "GPTNeoXForCausalLM", "bloom": "BloomForCausalLM",
           "llama": "LlamaForCausalLM", "mixtral": "MixtralForCausalLM"}


def hf_model(family: str, seed: int = 0, **overrides):
    """A float32 HF model whose every weight is random (norm scales around 1)."""
    torch.manual_seed(seed)
    model = getattr(transformers, CLASSES[family])(hf_config(family, **overrides))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    return model.eval()


def hf_logits_and_loss(model, tokens):
    """float32 logits and HF's own next-token loss for int tokens [b, s]."""
    ids = torch.as_tensor(tokens, dtype=torch.long)
    with torch.no_grad():
        out = model(input_ids=ids, labels=ids)
    return out.logits.float().numpy(), float(out.loss)
