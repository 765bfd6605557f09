"""Look up a model family's preset by name; count parameters without allocating."""
from __future__ import annotations

import math
from typing import Any

import jax
from flax import nnx

from jaxsmp.models import bloom, gpt_neox, llama, mixtral

FAMILIES: dict[str, dict[str, Any]] = {
    "gpt_neox": gpt_neox.PRESETS,
    "bloom": bloom.PRESETS,
    "llama": llama.PRESETS,
    "mixtral": mixtral.PRESETS,
}


def preset(family: str, name: str, **overrides: Any):
    """The config of preset ``name`` of ``family``, with fields replaced by ``overrides``."""
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; valid: {sorted(FAMILIES)}")
    presets = FAMILIES[family]
    if name not in presets:
        raise ValueError(f"unknown {family} preset {name!r}; valid: {list(presets)}")
    return presets[name].replace(**overrides) if overrides else presets[name]


def count_params(config) -> int:
    """Total parameter count from abstract shapes (nothing is allocated)."""
    abstract = nnx.eval_shape(lambda: config.build(nnx.Rngs(0)))
    state = nnx.state(abstract, nnx.Param)
    return sum(math.prod(x.shape) for x in jax.tree.leaves(state))
