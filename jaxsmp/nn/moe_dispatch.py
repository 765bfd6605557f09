"""Expert parallelism: a mixture of experts' tokens sent to their experts' devices by
all-to-all, and their outputs sent back the same way.

Inside the step's ``shard_map``, manual over the expert axis (``ep``), each device holds
``num_experts / ep`` consecutive experts (device ``j``: experts ``j * local ..``) and its
own tokens. A device routes its tokens over all experts (:meth:`MoE.route`), sorts the
``tokens x top_k`` assignments by expert (so by destination device) and writes them into
a send buffer ``[ep, slots, embed]``, one row of slots per destination; one
``jax.lax.all_to_all`` delivers each row to its device. The receiver sorts the rows it
got by local expert, runs the grouped GEMMs (``jax.lax.ragged_dot``) over its local
experts' weights, and a second all-to-all returns each output to the slot it came from;
the sender weights the outputs and sums them into their tokens.

Shapes are static, so the slots are a worst case. Dropless: a device's assignments may
all go to one destination, so each destination row holds ``tokens x top_k`` slots: the
send and receive buffers are ``ep x tokens x top_k x embed`` each, ``ep`` times the
assignments (the grouped GEMMs run over every slot, the empty ones adding zeros).
``jax.lax.ragged_all_to_all`` would send only the filled slots, but XLA:CPU does not
implement it (jax 0.10.2). With a capacity factor each expert keeps at most
``capacity`` assignments of each device (the earliest, as without ``ep``), so a
destination row holds ``local experts x capacity`` slots, which bounds the buffers.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def grouped_swiglu(rows: jax.Array, sizes: jax.Array, w1, w3, w2) -> jax.Array:
    """Rows grouped by expert (``sizes[e]`` consecutive rows each) through their experts'
    SwiGLU, as grouped GEMMs (``jax.lax.ragged_dot``); rows past the groups give zero."""
    rows = rows.astype(w1.dtype)
    h = jax.nn.silu(jax.lax.ragged_dot(rows, w1, sizes)) * jax.lax.ragged_dot(rows, w3, sizes)
    return jax.lax.ragged_dot(h.astype(w2.dtype), w2, sizes)


def _local_experts(rows: jax.Array, expert: jax.Array, w1, w3, w2) -> jax.Array:
    """Each row through its local expert's SwiGLU (``expert`` = ``len(w1)``: an empty
    slot, output zero), in the rows' order."""
    local = w1.shape[0]
    order = jnp.argsort(expert, stable=True)
    sizes = jnp.bincount(expert, length=local + 1)[:local].astype(jnp.int32)
    return grouped_swiglu(rows[order], sizes, w1, w3, w2)[jnp.argsort(order)]


def _slots(expert: jax.Array, sizes: jax.Array, local: int, capacity: int | None):
    """(destination device, slot in its row, kept?, slots per row) of each assignment,
    ``expert``: the assignments' experts in sorted order."""
    n = expert.shape[0]
    starts = jnp.cumsum(sizes) - sizes
    position = jnp.arange(n) - starts[expert]      # among its expert's assignments
    dest = expert // local
    if capacity is None:
        return dest, jnp.arange(n) - starts[dest * local], jnp.ones(n, bool), n
    keep = position < capacity
    per_row = local * capacity
    return dest, jnp.where(keep, (expert % local) * capacity + position, per_row), keep, \
        per_row


def expert_parallel(t: jax.Array, chosen: jax.Array, weights: jax.Array, w1, w3, w2,
                    axis: str, num_experts: int, capacity: int | None):
    """(float32 outputs ``[tokens, embed]``, assignments per expert ``[num_experts]``,
    dropped assignments) of this device's tokens ``t`` routed to ``chosen`` experts
    with ``weights``; ``w1``/``w3``/``w2``: this device's local experts' weights."""
    ep, local = jax.lax.axis_size(axis), w1.shape[0]
    if local * ep != num_experts:
        raise ValueError(f"{num_experts} experts over {axis}={ep}: each device holds "
                         f"{local}, but ep must divide the expert count")
    tokens, d = t.shape
    flat = chosen.reshape(-1)
    order = jnp.argsort(flat, stable=True)          # assignments grouped by expert
    expert = flat[order]
    sizes = jnp.bincount(flat, length=num_experts).astype(jnp.int32)
    dest, slot, keep, per_row = _slots(expert, sizes, local, capacity)
    token = order // chosen.shape[1]
    send = jnp.zeros((ep, per_row, d), w1.dtype).at[dest, slot].set(
        t[token].astype(w1.dtype), mode="drop")
    ids = jnp.full((ep, per_row), local, jnp.int32).at[dest, slot].set(
        (expert % local).astype(jnp.int32), mode="drop")
    recv = jax.lax.all_to_all(send, axis, 0, 0)     # row i: what device i sent here
    recv_ids = jax.lax.all_to_all(ids, axis, 0, 0)
    y = _local_experts(recv.reshape(ep * per_row, d), recv_ids.reshape(-1), w1, w3, w2)
    back = jax.lax.all_to_all(y.reshape(ep, per_row, d), axis, 0, 0)
    rows = back[dest, jnp.minimum(slot, per_row - 1)]
    scale = jnp.where(keep, weights.reshape(-1)[order], 0.0)
    out = jax.ops.segment_sum(rows.astype(jnp.float32) * scale[:, None], token,
                              num_segments=tokens)
    return out, sizes, jnp.sum(~keep).astype(jnp.float32)
