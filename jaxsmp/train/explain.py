"""``step.explain(state, batch)``: what a step runs on a batch, and why.

The choices are noted by the code that makes them, while the step is traced
(:func:`note`, from :mod:`jaxsmp.train.attention`; ``auto`` collectives through
:func:`collectives.scope`'s ``decisions``), or read from the step's own resolvers (the
pipeline split, ``_split_why``; the collectives name; the precision policy; which
Linears hold fp8 histories): an explanation cannot name a kernel the step does not run.
Tracing compiles nothing (``pipeline_partition="auto"`` compiles its stage costs once,
as the step does).
"""
from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import jax
from flax import nnx

import collectives
from jaxsmp.train.fp8_state import runs_fp8
from jaxsmp.train.precision import precision_policy

_NOTES: contextvars.ContextVar = contextvars.ContextVar("jaxsmp_explain", default=None)


@dataclass(frozen=True)
class Choice:
    """One choice: its ``value``, and ``why`` where a rule (``auto``) made it (None: as
    set by the user)."""
    value: str
    why: str | None = None

    def __str__(self) -> str:
        return self.value if self.why is None else f"{self.value} (auto: {self.why})"


def note(topic: str, value: str, why: str | None = None) -> None:
    """Records a choice made while a step is traced inside :func:`recording` (a no-op
    outside it)."""
    notes = _NOTES.get()
    if notes is not None and (topic, value, why) not in notes:
        notes.append((topic, value, why))


@contextlib.contextmanager
def recording() -> Iterator[list[tuple[str, str, str | None]]]:
    """Collects the :func:`note`\\ s made inside the block: (topic, value, why), once each."""
    token = _NOTES.set([])
    try:
        yield _NOTES.get()
    finally:
        _NOTES.reset(token)


@dataclass(frozen=True)
class Explanation:
    """What a step runs: ``attention`` holds one choice per distinct kernel traced (one,
    unless layers differ); ``fp8_gemms`` the Linears whose matmuls run in float8."""
    attention: tuple[Choice, ...]
    context_parallel: Choice
    pipeline: Choice
    pipeline_head: Choice
    collectives: Choice
    precision: Choice
    fp8_gemms: tuple[str, ...]
    remat: Choice
    prefetch: Choice
    activation_gather: Choice = Choice("none")

    @property
    def kernels(self) -> tuple[str, ...]:
        """The attention implementations the step runs (``cudnn``, ``pallas``, ...)."""
        return tuple(c.value for c in self.attention)

    def __str__(self) -> str:
        fp8 = (f"; fp8 GEMMs ({len(self.fp8_gemms)}): {', '.join(self.fp8_gemms)}"
               if self.fp8_gemms else "")
        rows = [("attention", "; ".join(map(str, self.attention)) or "none traced"),
                ("context parallel", str(self.context_parallel)),
                ("pipeline", str(self.pipeline)), ("pipeline head", str(self.pipeline_head)),
                ("collectives", str(self.collectives)),
                ("precision", f"{self.precision}{fp8}"), ("remat", str(self.remat)),
                ("prefetch", str(self.prefetch)),
                ("batch gathers", str(self.activation_gather))]
        return "\n".join(f"{name:<17} {text}" for name, text in rows)


def _one(notes, topic: str, default: Choice) -> Choice:
    """The choice noted on ``topic`` (several joined; ``default`` where none was)."""
    found = [Choice(v, w) for t, v, w in notes if t == topic]
    if len(found) < 2:
        return found[0] if found else default
    return Choice(" / ".join(c.value for c in found),
                  "; ".join(c.why for c in found if c.why) or None)


def _collectives(name: str, source: str, decisions: list) -> Choice:
    """The sdp gathers' algorithm: as set, or ``auto``'s picks per op and their reasons."""
    if name != "auto":
        return Choice(f"{name} (set by {source})")
    if not decisions:
        return Choice("none traced", f"{source}='auto'; the step gathers nothing over sdp")
    picks: dict[str, dict[str, None]] = {}  # op -> its picks, in the order traced
    for op, decision in decisions:
        picks.setdefault(op, {})[decision.pick] = None
    value = "; ".join(f"{op} {', '.join(p)}" for op, p in picks.items())
    reasons = dict.fromkeys(d.why for _, d in decisions)  # ordered, once each
    return Choice(value, f"{source}='auto', cost model: {'; '.join(reasons)}")


def _precision(options, state) -> tuple[Choice, tuple[str, ...]]:
    """The policy, and the Linears that hold fp8 histories (those whose GEMMs the step
    runs in float8, :func:`jaxsmp.train.fp8_state.runs_fp8`)."""
    policy = precision_policy(options.precision)
    text = (f"{options.precision}: compute {jax.numpy.dtype(policy.compute_dtype).name}, "
            f"float32 master parameters"
            + (", dynamic loss scaling" if policy.loss_scaling else ""))
    if not policy.fp8:
        return Choice(text), ()
    model = nnx.merge(state.graphdef, state.params)
    gemms = tuple(".".join(map(str, path)) for path, m in nnx.iter_modules(model)
                  if runs_fp8(m, options.fp8_vocab) and getattr(m, "fp8", None) is not None)
    vocab = "in float8" if options.fp8_vocab else (
        f"in {jax.numpy.dtype(policy.compute_dtype).name} (fp8_vocab=False)")
    return Choice(f"{text}, float8 GEMMs with delayed scaling ({options.fp8_history} steps "
                  f"of amax history), the vocabulary projection {vocab}"), gemms


def _pipeline(step, state, batch) -> tuple[Choice, Choice]:
    """The split and head placement, from the step's own resolver (``_split_why``)."""
    options, pp = step.options, state.mesh.pp
    if pp == 1:
        return Choice("none (pp=1)"), Choice("none (pp=1)")
    partition, spread, why = step._split_why(state, batch)
    split = partition if partition == "equal" else "layers " + ", ".join(map(str, partition))
    auto_split = options.pipeline_partition == "auto"
    auto_head = options.pipeline_head == "auto" and options.pipeline == "interleaved"
    head = ("spread over the stages" if spread else "the last stage" if
            options.pipeline == "interleaved" else "every stage, after the ticks")
    split_why, head_why = why or (None, None)
    return (Choice(f"{options.pipeline}, {pp} stages, {split}", split_why if auto_split else None),
            Choice(head, head_why if auto_head else None))


def explain_step(step, state, batch, body: Callable[[Any, Any], Any]) -> Explanation:
    """Traces ``body(state, batch)`` (the step's ``_gradients`` or ``_eval``; ``state``
    with fp8 histories, ``batch`` placed) and explains it (see the module docstring)."""
    options, mesh = step.options, state.mesh
    pipeline, head = _pipeline(step, state, batch)  # auto's costs compiled outside the trace
    decisions: list = []
    with recording() as notes, collectives.scope(decisions=decisions):
        jax.eval_shape(lambda s, b: body(s, b), state, batch)  # a fresh trace, never cached
    source = "the step's collectives" if options.collectives else "mesh.collectives"
    precision, gemms = _precision(options, state)
    platform = mesh.jax_mesh.devices.flat[0].platform
    prefetch = options.prefetches(platform)
    prefetch_why = None if options.prefetch is not None else f"{platform}: " + (
        "collectives run beside compute" if prefetch else
        "XLA pipelines the layer loop's gathers and reduce-scatters itself (XLA_FLAGS)"
        if platform in ("gpu", "cuda") else
        "XLA runs collectives in line, so prefetching would only cost memory")
    cp = Choice("none (cp=1)") if mesh.cp == 1 else _one(notes, "context_parallel",
                                                         Choice("none traced"))
    return Explanation(
        attention=tuple(Choice(v, w) for t, v, w in notes if t == "attention"),
        context_parallel=cp, pipeline=pipeline, pipeline_head=head,
        collectives=_collectives(step._collectives(state), source, decisions),
        precision=precision, fp8_gemms=gemms, remat=Choice(options.remat),
        prefetch=Choice("on" if prefetch else "off", prefetch_why),
        activation_gather=_one(notes, "activation_gather", Choice("none traced")))
