"""The layers' activations split over ``cp`` on the sequence, in the balanced order."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxsmp.context.layout import balance, unbalance
from jaxsmp.nn.stack import require_one_array


def split_sequence(x: jax.Array, mesh: jax.sharding.Mesh, axes: tuple[str, ...]) -> jax.Array:
    """``x`` ([batch, seq, ...]) constrained to its sequence split over ``axes``: on the
    step's ``shard_map`` mesh (batch already local) or, without one, on ``mesh``."""
    context = jax.sharding.get_abstract_mesh()
    target = mesh if context.empty else context
    spec = P(None, axes if len(axes) > 1 else axes[0], *[None] * (x.ndim - 2))
    return jax.lax.with_sharding_constraint(x, NamedSharding(target, spec))


def _per_token(x: Any, h: jax.Array) -> bool:
    return isinstance(x, jax.Array) and x.ndim >= 2 and x.shape[:2] == h.shape[:2]


def over_context(scan: Callable, mesh: jax.sharding.Mesh, cp: int,
                 axes: tuple[str, ...] = ("cp",)) -> Callable:
    """``scan`` (``scan(apply, h, params, args)``) on ``h`` and its per-token ``args``
    (arrays whose ``[batch, seq]`` match ``h``'s, e.g. rotary tables) put in the balanced
    order and split over ``axes`` (``cp``, or ``cp`` and ``tp`` with sequence parallelism)
    for every layer; the output comes back in the model's order."""
    # with tp the model's own ops (embedding, head, loss) are left to GSPMD: XLA's SPMD
    # partitioner aborts on their gathers of arrays split over cp and tp (jax 0.10.2)
    split_outside = mesh.shape["tp"] == 1

    def run(apply, h, params, args, **kw):
        require_one_array(h, "context parallelism (cp > 1)")

        def place(x):
            if not _per_token(x, h):
                return x
            if split_outside:  # the embedding and rotary tables computed split too
                x = split_sequence(x, mesh, axes)
            return split_sequence(balance(x, cp), mesh, axes)

        def layer(w, x, layer_args):
            return split_sequence(apply(w, split_sequence(x, mesh, axes), layer_args),
                                  mesh, axes)
        out = unbalance(scan(layer, place(h), params, jax.tree.map(place, args), **kw), cp)
        return split_sequence(out, mesh, axes) if split_outside else out
    return run
