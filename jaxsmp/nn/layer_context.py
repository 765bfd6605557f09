"""What the training step tells every stacked layer: how to gather it, how to remat it.

Models never see meshes or collectives. ``jaxsmp.step`` installs a context whose
``gather`` turns one layer's ``sdp`` shards into full parameters (ZeRO-3, one layer
at a time) and whose ``remat`` names the activation-checkpointing policy; outside a
step the defaults make a :class:`~jaxsmp.nn.Stack` a plain scan.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from flax import nnx


def _identity(state: nnx.State) -> nnx.State:
    return state


@dataclass(frozen=True)
class LayerContext:
    gather: Callable[[nnx.State], nnx.State] = _identity
    remat: str = "none"
    # With pp > 1: ``run_stages(run, x, params, args)`` runs the stage's local layers in
    # a pipeline schedule (see jaxsmp.pipeline.runner.StageRunner); None: a plain scan.
    run_stages: Callable[..., Any] | None = None
    # ``embed_lookup(table, tokens)``: an Embed's rows computed without its full table
    # (jaxsmp.train.embed_lookup), or None to use the table as it is.
    embed_lookup: Callable[[nnx.Variable, Any], Any] = lambda table, tokens: None


_CURRENT = contextvars.ContextVar("jaxsmp_layer_context", default=LayerContext())


def current_layer_context() -> LayerContext:
    return _CURRENT.get()


@contextlib.contextmanager
def layer_context(ctx: LayerContext) -> Iterator[LayerContext]:
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)
