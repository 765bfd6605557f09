"""An abstract training state (no arrays allocated) to restore a checkpoint into."""
from __future__ import annotations

from typing import Callable, Mapping

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxsmp.mesh import Mesh
from jaxsmp.sharding.rules import DEFAULT_RULES
from jaxsmp.train.precision import LossScale
from jaxsmp.train.state import TrainState, annotate_mesh_axes
from jaxsmp.checkpoint.tree import target_leaves


def abstract_state(build: Callable[[nnx.Rngs], nnx.Module], tx: optax.GradientTransformation,
                   mesh: Mesh, *, seed: int = 0, rules: Mapping | None = None,
                   loss_scale: LossScale | None = None) -> TrainState:
    """What :func:`jaxsmp.init` would return on ``mesh``, as ``ShapeDtypeStruct``
    leaves carrying their shardings: a template that costs no device memory."""
    rules = dict(DEFAULT_RULES if rules is None else rules)
    graphdef, params, rest = nnx.split(nnx.eval_shape(lambda: build(nnx.Rngs(seed))),
                                       nnx.Param, ...)
    if jax.tree.leaves(rest):
        raise NotImplementedError("jaxsmp trains models whose state is only nnx.Param")
    params = annotate_mesh_axes(params, mesh, rules)
    scale = loss_scale or LossScale.create()
    state = TrainState(
        step=jax.ShapeDtypeStruct((), jnp.int32), params=params,
        opt_state=jax.eval_shape(tx.init, params),
        loss_scale=jax.eval_shape(lambda: scale),
        rng=jax.eval_shape(lambda: jax.random.key_data(jax.random.key(seed))),
        graphdef=graphdef, tx=tx, mesh=mesh)
    return jax.tree.unflatten(jax.tree.structure(state), target_leaves(state))
