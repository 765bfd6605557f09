"""Context parallelism: every sequence split over the ``cp`` mesh axis.

``jaxsmp.Mesh(cp=4, ...)`` with ``jaxsmp.step(..., context_parallel="ulysses" | "ring" |
"auto")``. Inside the step ``cp`` is an automatic (GSPMD) axis, like ``tp``: the batch's
tokens are split over it on the sequence, the model runs on the whole logical sequence
(positions, the loss's shift and its mean stay global, so a model never sees ``cp``),
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

``auto`` (the default) picks ``ulysses`` where the heads allow it, else ``ring``.
"""
from jaxsmp.context.layout import balance, unbalance, unmasked_pairs

STRATEGIES = ("auto", "ulysses", "ring")

__all__ = ["STRATEGIES", "balance", "unbalance", "unmasked_pairs"]
