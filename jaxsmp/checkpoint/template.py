"""An abstract training state (no arrays allocated) to restore a checkpoint into."""
from __future__ import annotations

from collections.abc import Callable, Mapping

import optax
from flax import nnx

from jaxsmp.mesh import Mesh
from jaxsmp.train.precision import LossScale
from jaxsmp.train.state import TrainState, abstract_params


def abstract_state(build: Callable[[nnx.Rngs], nnx.Module], tx: optax.GradientTransformation,
                   mesh: Mesh, *, rules: Mapping | None = None,
                   loss_scale: LossScale | None = None) -> TrainState:
    """What :func:`jaxsmp.init` would return on ``mesh``, as ``ShapeDtypeStruct``
    leaves carrying their shardings: a template that costs no device memory."""
    graphdef, params = abstract_params(build, mesh, rules)
    return TrainState.create(graphdef, params, tx, mesh, loss_scale=loss_scale)
