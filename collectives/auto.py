"""``algorithm="auto"``: the modeled-fastest algorithm for a message size and topology."""
from __future__ import annotations

from collectives.cost_model import MODELED, CostModel, cross_host_bytes, current
from collectives.topology import Topology


def choose(nbytes: int, topo: Topology, model: CostModel | None = None) -> str:
    """Cheapest of :data:`MODELED` (ties go to the earlier name, so to ``xla`` first)."""
    model = model or current()
    return min(MODELED, key=lambda a: model.predict(a, nbytes, topo))


def explain(nbytes: int, topo: Topology, model: CostModel | None = None) -> str:
    """Human-readable table of predicted times and cross-host bytes, and the choice."""
    model = model or current()
    pick = choose(nbytes, topo, model)
    lines = [f"{nbytes} B per rank on {topo.hosts} host(s) x {topo.devices_per_host} device(s); "
             f"cost model: {model.source} (alpha_intra={model.alpha_intra:.3g}s "
             f"bw_intra={model.bw_intra:.3g}B/s alpha_inter={model.alpha_inter:.3g}s "
             f"bw_inter={model.bw_inter:.3g}B/s)"]
    for a in MODELED:
        xb = cross_host_bytes(a, nbytes, topo)
        note = " (modeled as ring)" if a == "xla" else ""
        mark = "  <- chosen" if a == pick else ""
        lines.append(f"  {a:<13} {model.predict(a, nbytes, topo) * 1e6:12.1f} us  "
                     f"cross-host {'?' if xb is None else xb:>12} B{note}{mark}")
    return "\n".join(lines)
