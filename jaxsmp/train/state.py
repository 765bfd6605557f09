"""The training state and its sharded initialisation."""
from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct
from jax.sharding import PartitionSpec as P

from jaxsmp.mesh import Mesh
from jaxsmp.nn.param import logical_axes
from jaxsmp.sharding.rules import DEFAULT_RULES, resolve_spec
from jaxsmp.train.precision import LossScale


@struct.dataclass
class TrainState:
    """Parameters (float32 master copy), optimizer state, step, loss scale and RNG key.

    Arrays live in their sharded layout on ``mesh``; ``graphdef`` rebuilds the
    model from ``params`` (``nnx.merge(state.graphdef, state.params)``).
    """
    step: jax.Array
    params: nnx.State
    opt_state: optax.OptState
    loss_scale: LossScale
    rng: jax.Array
    graphdef: nnx.GraphDef = struct.field(pytree_node=False)
    tx: optax.GradientTransformation = struct.field(pytree_node=False)
    mesh: Mesh = struct.field(pytree_node=False)

    @property
    def model(self) -> nnx.Module:
        return nnx.merge(self.graphdef, self.params)


def _is_var(x) -> bool:
    return isinstance(x, nnx.Variable)


def annotate_mesh_axes(params: nnx.State, mesh: Mesh, rules: Mapping) -> nnx.State:
    """Records each parameter's resolved mesh axes in its ``mesh_axes`` metadata."""
    def annotate(path, var: nnx.Variable) -> nnx.Variable:
        name = "/".join(str(getattr(k, "key", k)) for k in path)
        spec = resolve_spec(name, logical_axes(var), var.shape, mesh.shape, rules)
        new = var.replace(var.get_value() if hasattr(var, "get_value") else var[...])
        new.set_metadata(mesh_axes=tuple(spec))
        return new
    return jax.tree_util.tree_map_with_path(annotate, params, is_leaf=_is_var)


def state_shardings(tree: Any, mesh: Mesh) -> Any:
    """NamedShardings for a tree of parameters or optimizer state: leaves under a
    parameter-shaped Variable follow its ``mesh_axes``; the rest are replicated."""
    def sharding(x):
        if _is_var(x) and "mesh_axes" in x.get_metadata():
            return mesh.sharding(P(*x.get_metadata()["mesh_axes"]))
        return mesh.sharding(P())
    return jax.tree.map(sharding, tree, is_leaf=_is_var)


def _split_params(model: nnx.Module):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    if jax.tree.leaves(rest):
        raise NotImplementedError(
            f"jaxsmp trains models whose state is only nnx.Param; found other state: "
            f"{jax.tree.map(jnp.shape, rest)}")
    return graphdef, params


def init(build: Callable[[nnx.Rngs], nnx.Module], tx: optax.GradientTransformation,
         mesh: Mesh, *, seed: int = 0, rules: Mapping | None = None,
         loss_scale: LossScale | None = None) -> TrainState:
    """Creates parameters and optimizer state directly in their sharded layout.

    ``build(rngs)`` constructs the model; it runs only abstractly and then inside one
    jit whose ``out_shardings`` place every array, so no device or host ever holds
    the full model.
    """
    rules = dict(DEFAULT_RULES if rules is None else rules)
    graphdef, abstract = _split_params(nnx.eval_shape(lambda: build(nnx.Rngs(seed))))
    abstract = annotate_mesh_axes(abstract, mesh, rules)
    param_shardings = state_shardings(abstract, mesh)
    opt_shardings = state_shardings(jax.eval_shape(tx.init, abstract), mesh)

    def create():
        _, params = _split_params(build(nnx.Rngs(seed)))
        params = annotate_mesh_axes(params, mesh, rules)
        return params, tx.init(params)

    with jax.sharding.use_mesh(mesh.jax_mesh) if hasattr(jax.sharding, "use_mesh") \
            else jax.set_mesh(mesh.jax_mesh):
        params, opt_state = jax.jit(create, out_shardings=(param_shardings, opt_shardings))()
    replicated = mesh.sharding(P())
    return TrainState(
        step=jax.device_put(jnp.int32(0), replicated), params=params, opt_state=opt_state,
        loss_scale=jax.device_put(loss_scale or LossScale.create(), replicated),
        rng=jax.device_put(jax.random.key_data(jax.random.key(seed)), replicated),
        graphdef=graphdef, tx=tx, mesh=mesh)
