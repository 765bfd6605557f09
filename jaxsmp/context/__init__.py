"""Context parallelism: every sequence split over the ``cp`` mesh axis.

``jaxsmp.Mesh(cp=4, ...)`` with ``jaxsmp.step(..., context_parallel="ulysses" | "ring" |
"auto")``. Inside the step ``cp`` is an automatic (GSPMD) axis, like ``tp``: the batch's
tokens stay whole over it, the model runs on the whole logical sequence (positions, the
loss's shift and its mean stay global, so a model never sees ``cp``),
and GSPMD sums every parameter's gradient over ``cp`` as over a data axis. Between a
:class:`~jaxsmp.nn.Stack`'s layers the activations are kept split over ``cp`` in the
load-balanced order of :mod:`.layout` (:func:`.sequence.over_context`); attention is the
only op that needs other devices' tokens, and runs per device (:mod:`jaxsmp.train.attention`)
with one of two strategies:

* ``ulysses`` (:mod:`.ulysses`): all-to-all to whole sequences of ``heads/cp`` heads, any
  kernel (cuDNN, Pallas, blockwise), all-to-all back. Needs the query heads per ``tp``
  device divisible by ``cp`` (grouped key/value heads are repeated where needed).
* ``ring`` (:mod:`.ring`): key/value blocks passed around the ring, merged by their
  log-sum-exp, masked blocks skipped; any head count; causal attention only; blocks in
  XLA (like ``blockwise``).

``auto`` (the default): :func:`choose_strategy`.
"""
from jaxsmp.context.layout import balance, unbalance, unmasked_pairs
from jaxsmp.context.ulysses import fits
from pallas_kernels.attention import GPU_PLATFORMS

STRATEGIES = ("auto", "ulysses", "ring")
RING_IMPLS = ("auto", "blockwise", "reference")  # ring's blocks are XLA tiles


def choose_strategy(heads: int, cp: int, tp: int, platform: str, ring_ok: bool) -> str:
    """What ``auto`` runs. On GPUs ``ulysses`` where ``cp`` divides the query heads per
    ``tp`` device (whole sequences through the fused cuDNN/Pallas kernel), else ``ring``;
    elsewhere ``ring`` (measured on XLA:CPU, ``bench/context_parallel.py``: 1.14x and
    1.37x the tokens/s of no ``cp`` at 2k and 8k tokens, ulysses 1.04x and 1.01x) unless
    it cannot serve the call (``ring_ok``: causal, no segment ids, an XLA ``impl``)."""
    return decide_strategy(heads, cp, tp, platform, ring_ok)[0]


def decide_strategy(heads: int, cp: int, tp: int, platform: str,
                    ring_ok: bool) -> tuple[str, str]:
    """(:func:`choose_strategy`'s strategy, why it is the one)."""
    local = f"cp={cp} {{}} the {heads // tp if heads % tp == 0 else heads} query heads " \
            f"per tp device"
    if fits(heads, cp, tp):
        if platform in GPU_PLATFORMS:
            return "ulysses", (f"{platform}: {local.format('divides')}, so whole sequences go "
                               f"through the fused attention kernel")
        if not ring_ok:
            return "ulysses", (f"{platform}: ring cannot serve the call (it runs causal "
                               f"attention without segment ids, in XLA tiles)")
        return "ring", (f"{platform}: ring is the faster off GPUs (bench/context_parallel.py: "
                        f"1.37x the tokens/s of no cp at 8k tokens, ulysses 1.01x)")
    return "ring", f"{local.format('does not divide')}; ring takes any head count"


__all__ = ["RING_IMPLS", "STRATEGIES", "balance", "choose_strategy", "decide_strategy",
           "unbalance",
           "unmasked_pairs"]
