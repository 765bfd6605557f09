"""What every model config shares: field replacement and building the model."""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from flax import nnx


class ModelConfig:
    """Mixin for frozen config dataclasses; ``model_class`` is set by the family module."""
    model_class: ClassVar[type]

    def replace(self, **changes: Any):
        return dataclasses.replace(self, **changes)

    def build(self, rngs: nnx.Rngs) -> nnx.Module:
        return type(self).model_class(self, rngs=rngs)
