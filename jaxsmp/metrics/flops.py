"""Model FLOPs per trained token (the PaLM appendix B convention)."""
from __future__ import annotations

from jaxsmp.models.registry import count_params


def train_flops_per_token(config, seq_len: int) -> float:
    """6 x matmul parameters + 12 x layers x width x seq (attention scores and mix),
    forward and backward. The input embedding lookup is not a matmul; a tied
    embedding is, as the output head. A mixture of experts counts only the parameters
    a token uses (its chosen experts)."""
    params = count_params(config) - getattr(config, "inactive_expert_params", 0)
    if not getattr(config, "tie_word_embeddings", False):
        params -= config.vocab_size * config.hidden_size
    attention = 12 * config.num_hidden_layers * config.hidden_size * seq_len
    return 6.0 * params + attention
