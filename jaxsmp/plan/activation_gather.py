"""What the step's ``activation_gather="auto"`` changes in a candidate: the choice is
the step's own (:func:`jaxsmp.train.activation_gather.pick` on the workload's kernels),
and a chosen axis's weights leave the sdp gathers while activation-sized collectives
join them (:mod:`jaxsmp.train.activation_gather`)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from jaxsmp.plan.candidate import Candidate
from jaxsmp.plan.comm import gather_seconds
from jaxsmp.plan.hardware import Cluster
from jaxsmp.plan.workload import Workload
from jaxsmp.train import activation_gather as step_rule


@dataclass(frozen=True)
class Split:
    """One candidate's activation gathering. ``layer_weights`` / ``top_weights``: kernel
    elements (one layer's; outside the stack) kept split, not gathered;
    ``layer_collectives`` / ``top_collectives``: per microbatch, (count, shard bytes
    per device) of the activation-sized collectives and the shard moves that replace
    their gathers, priced as all-gathers of that shard. ``layer_input``: elements per
    device of a layer's gathered MLP input (the batch of the whole sdp group), which
    its column Linears share and, without remat, the backward pass keeps."""
    axes: frozenset = frozenset()
    layer_weights: int = 0
    top_weights: int = 0
    layer_collectives: tuple[tuple[int, float], ...] = ()
    top_collectives: tuple[tuple[int, float], ...] = ()
    layer_input: int = 0

    def seconds(self, cluster: Cluster, c: Candidate, top: bool = False) -> float:
        found = self.top_collectives if top else self.layer_collectives
        return sum(n * gather_seconds(cluster, c.sdp, 1, nbytes) for n, nbytes in found)


def planned(w: Workload, c: Candidate, tokens: int, cbytes: int) -> Split:
    """The step's choice for ``c`` at ``tokens`` per device and microbatch."""
    if step_rule.unsupported(c.mesh_shape, c):
        return Split()
    kernels = step_rule.kernels_of((q.axes, q.shape) for q in w.params)
    axes, _ = step_rule.pick(kernels, "auto", tokens, c.sdp, c.remat)
    mine = [k for k in kernels if set(k[0]) & axes]
    p = c.sdp

    def priced(stacked: bool) -> tuple:   # as all-gathers of 1/p of each buffer
        return tuple((n, elements / p * cbytes) for k in mine if k[2] == stacked
                     for n, elements in step_rule.transfers(k, tokens, p, c.remat))

    def weights(stacked: bool) -> int:
        return sum(math.prod(k[1]) for k in mine if k[2] == stacked)
    # a layer's column Linears (output axis split) all read the MLP's input
    widths = {k[1][0] for k in mine if k[2] and k[0][1] in axes}
    return Split(axes, weights(True), weights(False), priced(True), priced(False),
                 tokens * p * sum(widths))
