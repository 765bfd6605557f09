"""Plans as a table, as JSON, and why the best one wins."""
from __future__ import annotations

from collections.abc import Callable, Sequence

from jaxsmp.plan.search import Plan

GiB = 1 << 30
_HEADER = (f"{'#':>3}  {'configuration':<58} {'GiB/GPU':>8}  {'state':>6} {'grads':>6} "
           f"{'gather':>6} {'activ':>6} {'work':>6} {'fwk':>5}  {'TFLOP/s':>7} {'MFU':>5} "
           f"{'step s':>7}")


def table(plans: Sequence[Plan]) -> str:
    """One line per plan: configuration, memory per GPU and its parts (at the step's
    peak), model TFLOP/s per GPU, MFU and step time."""
    lines = [_HEADER]
    for i, p in enumerate(plans, 1):
        m = p.memory
        work = m.working + m.logits + m.batch
        lines.append(
            f"{i:>3}  {_label(p):<58} {m.total / GiB:>8.1f}  {m.state / GiB:>6.1f} "
            f"{m.grads / GiB:>6.1f} {m.gathered / GiB:>6.1f} {m.activations / GiB:>6.1f} "
            f"{work / GiB:>6.1f} {m.framework / GiB:>5.1f}  "
            f"{p.throughput.model_tflops_per_gpu:>7.1f} {p.throughput.mfu:>5.1%} "
            f"{p.throughput.step_seconds:>7.2f}" + ("" if p.fits else "  (does not fit)"))
    return "\n".join(lines)


def _label(p: Plan) -> str:
    """The configuration, with the layers per stage when the stages differ."""
    stages = p.time.stages
    split = f" layers {','.join(map(str, stages))}" if len(set(stages)) > 1 else ""
    return p.candidate.label() + split + (" head spread" if p.time.spread_head else "")


def _shares(p: Plan) -> str:
    t = p.time
    parts = {"compute": t.compute, "exposed sdp collectives": t.sdp,
             "compute lost to hidden collectives": t.contention, "tp all-reduces": t.tp,
             "pipeline sends": t.pp, "pipeline bubble": t.bubble, "dp all-reduce": t.dp,
             "optimizer": t.optimizer, "offload transfers": t.offload,
             "cp attention transfers": t.cp, "ep all-to-alls": t.ep,
             "waiting for the slowest GPU": t.stragglers}
    shown = [f"{name} {value / t.total:.0%}" for name, value in parts.items()
             if value / t.total >= 0.005]
    return ", ".join(shown)


def _reduction(c) -> str:
    """The gradient reduction's dtype, and whether it is the step's default."""
    default = (f" (the step's default for precision={c.precision!r})"
               if c.reduce_dtype is None else "")
    return f"gradients reduced in {c.reduced}{default}"


def _need(p: Plan) -> str:
    """What a plan needs per GPU, against the limit it misses or the capacity."""
    m = p.memory
    if m.total <= p.capacity and not p.within_xla_limit:
        return (f"{m.temporaries / GiB:.1f} GiB of temporaries per GPU beside "
                f"{m.arguments / GiB:.1f} of state (peak at the {m.phase} pass), above "
                f"the {p.temporaries_limit / GiB:.1f} XLA plans them within (it would recompute)")
    return (f"{m.total / GiB:.1f} GiB per GPU (peak at the {m.phase} pass) of "
            f"{p.capacity / GiB:.1f}")


def _best(plans: Sequence[Plan], keep: Callable[[Plan], bool]) -> Plan | None:
    return next((p for p in plans if p.fits and keep(p)), None)


def why(plans: Sequence[Plan]) -> str:
    """Why the first (fastest fitting) plan wins, against the runner-up, the best plan
    of each other kind, and any faster configuration that does not fit."""
    best = _best(plans, lambda p: True)
    if best is None:
        smallest = min(plans, key=lambda p: p.memory.total)
        return (f"No configuration fits: the smallest, {smallest.candidate.label()}, needs "
                f"{_need(smallest)}. Use more nodes, GPUs with more memory, or a shorter sequence.")
    b = best.candidate
    lines = [f"#1 {_label(best)}: {best.throughput.step_seconds:.2f} s per step "
             f"({_shares(best)}), {best.memory.total / GiB:.1f} of "
             f"{best.capacity / GiB:.1f} GiB per GPU; {_reduction(b)}."]
    rivals = [
        ("runner-up", lambda p: p is not best),
        ("best with another tp", lambda p: p.candidate.tp != b.tp),
        ("best with another pp", lambda p: p.candidate.pp != b.pp),
        ("best with another remat", lambda p: p.candidate.remat != b.remat),
        ("best with another sdp", lambda p: p.candidate.sdp != b.sdp),
        ("best with another cp", lambda p: p.candidate.cp != b.cp),
        ("best with another ep", lambda p: p.candidate.ep != b.ep),
    ]
    named: dict[int, tuple[Plan, list[str]]] = {}
    for name, keep in rivals:
        rival = _best(plans, keep)
        if rival is not None:
            named.setdefault(id(rival), (rival, []))[1].append(name)
    for rival, names in named.values():
        slower = rival.throughput.step_seconds / best.throughput.step_seconds - 1
        lines.append(f"{names[0]}" + (f" (also {', '.join(names[1:])})" if names[1:] else "")
                     + f": {rival.candidate.label()} is {slower:.1%} slower ({_shares(rival)}).")
    faster = [p for p in plans if not p.fits
              and p.throughput.step_seconds < best.throughput.step_seconds]
    if faster:
        top = min(faster, key=lambda p: p.throughput.step_seconds)
        lines.append(f"faster but does not fit: {top.candidate.label()} would need "
                     f"{_need(top)}.")
    return "\n".join(lines)


def records(plans: Sequence[Plan]) -> list[dict]:
    """JSON-ready dictionaries, in the plans' order."""
    return [p.as_dict() for p in plans]
