"""``algorithm="auto"``: the fastest algorithm for a message size and topology, by the cost
model (measured where calibrated; see :mod:`collectives.cost_model` and
:mod:`collectives.profile`)."""
from __future__ import annotations

from dataclasses import dataclass

from collectives.cost_model import MODELED, CostModel, cross_host_bytes, topology_key
from collectives.layout import axis_names
from collectives.profile import default_model
from collectives.topology import Topology

MARGIN = 0.05  # predicted within 5% of the fastest: a tie


@dataclass(frozen=True)
class Decision:
    pick: str
    seconds: dict[str, float | None]  # predicted per candidate; None: not calibrated
    why: str                          # where the prediction came from, or why xla


def resolve(model: CostModel | None) -> tuple[CostModel | None, str]:
    """The model to use and where it came from: the given one, else the scope's, else the
    calibration cached for this host (see :func:`collectives.profile.default_model`)."""
    from collectives.context import current
    if model is None:
        model = current().cost_model
    if model is not None:
        return model, model.source
    return default_model()


def decide(nbytes: int, topo: Topology, model: CostModel | None = None, *,
           op: str = "all_gather", ffi: bool = False) -> Decision:
    """The cheapest candidate, where a candidate within :data:`MARGIN` of the cheapest
    counts as a tie and ties go to the earlier name (so to ``xla`` first: measurements
    are noisy, and a near-tie is no reason to leave XLA's own collective); ``ffi`` is a
    candidate only when the caller says it can run. With no model at all, or none that
    knows this topology, the pick is ``xla`` and ``why`` says so."""
    model, source = resolve(model)
    if model is None:
        return Decision("xla", {}, source)
    candidates = MODELED + (("ffi",) if ffi else ())
    seconds = {a: model.predict(a, nbytes, topo, op) for a in candidates}
    known = {a: t for a, t in seconds.items() if t is not None}
    if not known:
        calibrated = sorted(model.measured.get(op, {}))
        return Decision("xla", seconds, f"{source}: topology {topology_key(topo)} was not "
                        f"calibrated for {op} (calibrated: {calibrated}) and the model does not "
                        f"extrapolate on this backend: xla")
    best = min(known.values())
    return Decision(next(a for a, t in known.items() if t <= best * (1 + MARGIN)), seconds,
                    source)


def choose(nbytes: int, topo: Topology, model: CostModel | None = None, *,
           op: str = "all_gather", ffi: bool = False) -> str:
    return decide(nbytes, topo, model, op=op, ffi=ffi).pick


def explain(nbytes: int, topo: Topology | None = None, model: CostModel | None = None, *,
            op: str = "all_gather", mesh=None, axis_name=None) -> str:
    """Human-readable table of predicted times and cross-host bytes per candidate, and the
    choice with its reason. With ``mesh`` and ``axis_name``: the topology of that axis and
    whether ``ffi`` can run over it (and why not)."""
    from collectives.ffi.mpi_env import usable
    names = None if axis_name is None else axis_names(axis_name)
    if topo is None:
        if mesh is None or names is None:
            raise ValueError("explain needs a topology, or a mesh and an axis_name")
        topo = Topology.for_mesh_axis(mesh, names)
    ffi_ok, ffi_why = usable(mesh, names) if names else (False, "no mesh axis given")
    model, _ = resolve(model)
    d = decide(nbytes, topo, model, op=op, ffi=ffi_ok) if model else decide(nbytes, topo, op=op)
    lines = [f"{op} of {nbytes} B per rank on {topo.hosts} host(s) x {topo.devices_per_host} "
             f"device(s); cost model: {d.why}"]
    if model is not None:
        lines.append(f"  links: alpha_intra={model.alpha_intra:.3g}s "
                     f"bw_intra={model.bw_intra:.3g}B/s alpha_inter={model.alpha_inter:.3g}s bw_inter={model.bw_inter:.3g}B/s")
    for a, t in d.seconds.items():
        xb = cross_host_bytes(a, nbytes, topo)
        time = "not calibrated" if t is None else f"{t * 1e6:12.1f} us"
        modeled = a == "xla" and model is not None and not model.measured
        note = " (modeled as NCCL's ring)" if modeled else ""
        mark = "  <- chosen" if a == d.pick else ""
        lines.append(f"  {a:<13} {time}  cross-host {'?' if xb is None else xb:>12} B{note}{mark}")
    if not d.seconds:
        lines.append("  xla  <- chosen")
    lines.append(f"  ffi: {'candidate' if ffi_ok else 'not a candidate'}: {ffi_why}")
    return "\n".join(lines)
