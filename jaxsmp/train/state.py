"""The training state and its sharded initialisation."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx, struct
from jax.sharding import PartitionSpec as P

from collectives import axis_names
from jaxsmp.mesh import Mesh
from jaxsmp.nn.fp8 import Fp8Meta
from jaxsmp.nn.param import is_var, logical_axes, path_names
from jaxsmp.sharding.rules import DEFAULT_RULES, resolve_spec
from jaxsmp.train.precision import LossScale


@struct.dataclass
class TrainState:
    """Parameters (float32 master copy), optimizer state, step and loss scale.

    Arrays live in their sharded layout on ``mesh``; ``graphdef`` rebuilds the
    model from ``params`` (``nnx.merge(state.graphdef, state.params)``).
    """
    step: jax.Array
    params: nnx.State
    opt_state: optax.OptState
    loss_scale: LossScale
    graphdef: nnx.GraphDef = struct.field(pytree_node=False)
    tx: optax.GradientTransformation = struct.field(pytree_node=False)
    mesh: Mesh = struct.field(pytree_node=False)

    @property
    def model(self) -> nnx.Module:
        return nnx.merge(self.graphdef, self.params)

    @classmethod
    def create(cls, graphdef: nnx.GraphDef, params: nnx.State,
               tx: optax.GradientTransformation, mesh: Mesh, *,
               loss_scale: LossScale | None = None) -> TrainState:
        """The state at step 0 for ``params`` annotated by :func:`annotate_mesh_axes`:
        placed arrays give a placed state (optimizer state initialised in its sharded
        layout); ``jax.ShapeDtypeStruct`` values give an abstract one whose leaves carry
        their shardings (a template for restoring or lowering; nothing allocated)."""
        scale = loss_scale or LossScale.create()
        params_only = nnx.filter_state(params, nnx.Param)  # not fp8 amax histories
        opt_shardings = state_shardings(jax.eval_shape(tx.init, params_only), mesh)
        if all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(params)):
            state = cls(step=jax.ShapeDtypeStruct((), jnp.int32), params=params,
                        opt_state=jax.eval_shape(tx.init, params_only),
                        loss_scale=jax.eval_shape(lambda: scale),
                        graphdef=graphdef, tx=tx, mesh=mesh)
            shardings = jax.tree.leaves(state_shardings(state, mesh))
            return jax.tree.unflatten(jax.tree.structure(state), [
                jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s)
                for x, s in zip(jax.tree.leaves(state), shardings)])
        replicated = mesh.sharding(P())
        return cls(step=jax.device_put(jnp.int32(0), replicated), params=params,
                   opt_state=jax.jit(tx.init, out_shardings=opt_shardings)(params_only),
                   loss_scale=jax.device_put(scale, replicated),
                   graphdef=graphdef, tx=tx, mesh=mesh)


def annotate_mesh_axes(params: nnx.State, mesh: Mesh, rules: Mapping) -> nnx.State:
    """Records each parameter's resolved mesh axes in its ``mesh_axes`` metadata."""
    def annotate(path, var: nnx.Variable) -> nnx.Variable:
        spec = resolve_spec("/".join(path_names(path)), logical_axes(var), var.shape,
                            mesh.shape, rules)
        new = var.replace(var.get_value() if hasattr(var, "get_value") else var[...])
        new.set_metadata(mesh_axes=tuple(spec))
        return new
    annotated = jax.tree_util.tree_map_with_path(annotate, params, is_leaf=is_var)
    _check_expert_axis(annotated, mesh)
    return annotated


def _check_expert_axis(params: nnx.State, mesh: Mesh) -> None:
    """``ep > 1`` needs a parameter split over ep (a mixture of experts' experts)."""
    if mesh.ep == 1:
        return
    split = {a for v in jax.tree.leaves(params, is_leaf=is_var)
             for d in v.get_metadata()["mesh_axes"] for a in axis_names(d)}
    if "ep" not in split:
        raise ValueError(
            f"mesh degree ep={mesh.ep} splits a mixture of experts' experts over ep, but "
            f"no parameter of this model is split over ep (a dense model has no experts); "
            f"use ep=1 and give those devices to the data axes, e.g. "
            f"sdp={mesh.ep * mesh.sdp} or dp={mesh.ep * mesh.dp}")


def state_shardings(tree: Any, mesh: Mesh) -> Any:
    """NamedShardings for a tree of parameters or optimizer state: leaves under a
    parameter-shaped Variable follow its ``mesh_axes``; the rest are replicated."""
    def sharding(x):
        if is_var(x) and "mesh_axes" in x.get_metadata():
            return mesh.sharding(P(*x.get_metadata()["mesh_axes"]))
        return mesh.sharding(P())
    return jax.tree.map(sharding, tree, is_leaf=is_var)


def split_params(model: nnx.Module) -> tuple[nnx.GraphDef, nnx.State]:
    """(graph definition, parameters) of a model whose state is only ``nnx.Param`` (and
    fp8 amax histories, :class:`~jaxsmp.nn.fp8.Fp8Meta`)."""
    graphdef, params, rest = nnx.split(model, nnx.Any(nnx.Param, Fp8Meta), ...)
    if jax.tree.leaves(rest):
        raise NotImplementedError(
            f"jaxsmp trains models whose state is only nnx.Param; found other state: "
            f"{jax.tree.map(jnp.shape, rest)}")
    return graphdef, params


def abstract_params(build: Callable[[nnx.Rngs], nnx.Module], mesh: Mesh,
                    rules: Mapping | None = None) -> tuple[nnx.GraphDef, nnx.State]:
    """(graph definition, parameter shapes annotated with their mesh axes); nothing
    is allocated."""
    graphdef, params = split_params(nnx.eval_shape(lambda: build(nnx.Rngs(0))))
    return graphdef, annotate_mesh_axes(params, mesh, dict(DEFAULT_RULES if rules is None
                                                           else rules))


def init(build: Callable[[nnx.Rngs], nnx.Module], tx: optax.GradientTransformation,
         mesh: Mesh, *, seed: int = 0, rules: Mapping | None = None,
         loss_scale: LossScale | None = None) -> TrainState:
    """Creates parameters and optimizer state directly in their sharded layout.

    ``build(rngs)`` constructs the model; it runs only abstractly and then inside one
    jit whose ``out_shardings`` place every array, so no device or host ever holds
    the full model.
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed must be an int, got {seed!r}")
    rules = dict(DEFAULT_RULES if rules is None else rules)
    graphdef, abstract = abstract_params(build, mesh, rules)

    def create():
        return annotate_mesh_axes(split_params(build(nnx.Rngs(seed)))[1], mesh, rules)

    with jax.sharding.use_mesh(mesh.jax_mesh) if hasattr(jax.sharding, "use_mesh") \
            else jax.set_mesh(mesh.jax_mesh):
        params = jax.jit(create, out_shardings=state_shardings(abstract, mesh))()
    return TrainState.create(graphdef, params, tx, mesh, loss_scale=loss_scale)
