"""Ring attention over the ``cp`` axis, on the load-balanced order of :mod:`.layout`.

Called inside a ``shard_map`` manual over ``cp``: each device holds its query block and
passes key/value blocks around the ring with ``ppermute``; partial results are combined
by their log-sum-exp. Device ``r`` holds sequence chunks ``r`` and ``2·cp-1-r``
(``c`` tokens each). At ring step ``t`` it holds the key/value chunks of device
``src = r - t``: at ``t = 0`` its own (two diagonal blocks and one full one); for
``src < r`` every local query sees the first of them and none the second; for
``src > r`` only the second query chunk sees both. So every device computes the same
``2c²`` scores per step and blocks that the causal mask hides entirely are never
computed. Each ``c x c`` chunk pair runs as FlashAttention tiles in XLA
(:func:`pallas_kernels.blockwise.forward`), so memory grows with ``c``, not ``c²``. The
backward pass (a custom VJP: recompute each pair from the saved output and the final
log-sum-exp) sends the key/value blocks around the ring again with their gradient
accumulators, which a last ``ppermute`` brings home.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels import blockwise

AXIS = "cp"
TILE = 256  # FlashAttention tile edge within a chunk pair (XLA loops; at most)


def tile_size(c: int) -> int:
    """The largest tile of at most :data:`TILE` dividing the chunk length ``c``."""
    return max(b for b in range(1, min(c, TILE) + 1) if c % b == 0)


def _bias_shift(slopes, shift):
    """ALiBi's constant ``slope * (k_start - q_start)`` between two chunks, per head: the
    tiles see positions relative to their own chunk."""
    return 0.0 if slopes is None else slopes[None, :, :, None] * shift.astype(jnp.float32)


def _block(q5, k, v, slopes, scale, causal, shift):
    """(out float32 [b, c, kvh, g, d], lse [b, kvh, g, c]) of one c x c chunk pair,
    FlashAttention's tiles (:func:`pallas_kernels.blockwise.forward`): memory linear in c."""
    c = q5.shape[1]
    out, lse = blockwise.forward(q5, k, v, slopes, None, scale, causal, tile_size(c),
                                 tile_size(c))
    return jnp.moveaxis(out, 3, 1), lse + _bias_shift(slopes, shift)


def _block_grads(q5, k, v, do5, lse, delta, slopes, scale, causal, shift):
    """(dq5, dk, dv) float32 of one chunk pair, from the final ``lse`` of its queries."""
    c = q5.shape[1]
    dq, dk, dv = blockwise.backward(q5, k, v, do5, lse - _bias_shift(slopes, shift), delta,
                                    slopes, None, scale, causal, tile_size(c),
                                    tile_size(c))
    return dq * scale, dk * scale, dv


def _merge(acc, part):
    """Two partial (out, lse) of the same queries combined by their log-sum-exp."""
    (o1, l1), (o2, l2) = acc, part
    lse = jnp.logaddexp(l1, l2)
    w1 = jnp.moveaxis(jnp.exp(l1 - lse), 3, 1)[..., None]
    w2 = jnp.moveaxis(jnp.exp(l2 - lse), 3, 1)[..., None]
    return o1 * w1 + o2 * w2, lse


def _shift(tree, n: int):
    """Every block one step along the ring: device i's goes to device i + 1."""
    return jax.tree.map(lambda x: lax.ppermute(x, AXIS, [(i, (i + 1) % n) for i in range(n)]),
                        tree)


def _starts(r, n: int, c: int):
    """First global positions of the two chunks device ``r`` holds."""
    return r * c, (2 * n - 1 - r) * c


def _halves(x, c: int, axis: int):
    return lax.slice_in_dim(x, 0, c, axis=axis), lax.slice_in_dim(x, c, 2 * c, axis=axis)


def _cat(a, b):
    """Two row halves of (out, lse) joined: out on axis 1, lse on axis 3."""
    return jnp.concatenate([a[0], b[0]], 1), jnp.concatenate([a[1], b[1]], 3)


def _forward(q5, k, v, slopes, scale):
    n, r, c = lax.axis_size(AXIS), lax.axis_index(AXIS), q5.shape[1] // 2
    (qa, qb), (ka, kb), (va, vb) = (_halves(x, c, 1) for x in (q5, k, v))
    qa0, qb0 = _starts(r, n, c)
    block = functools.partial(_block, slopes=slopes, scale=scale)
    acc = _cat(block(qa, ka, va, causal=True, shift=jnp.int32(0)),
               _merge(block(qb, ka, va, causal=False, shift=qa0 - qb0),
                      block(qb, kb, vb, causal=True, shift=jnp.int32(0))))

    def step(t, carry):
        k, v, acc = carry
        k, v = _shift((k, v), n)
        src = (r - t) % n
        ka0, kb0 = _starts(src, n, c)

        def earlier(k, v):  # every query sees the first key chunk, none the second
            (ka, _), (va, _) = _halves(k, c, 1), _halves(v, c, 1)
            return _cat(block(qa, ka, va, causal=False, shift=ka0 - qa0),
                        block(qb, ka, va, causal=False, shift=ka0 - qb0))

        def later(k, v):  # only the second query chunk sees keys, both chunks
            (ka, kb), (va, vb) = _halves(k, c, 1), _halves(v, c, 1)
            out_b = _merge(block(qb, ka, va, causal=False, shift=ka0 - qb0),
                           block(qb, kb, vb, causal=False, shift=kb0 - qb0))
            return _cat((jnp.zeros_like(out_b[0]), jnp.full_like(out_b[1], -jnp.inf)), out_b)
        return k, v, _merge(acc, lax.cond(src < r, earlier, later, k, v))
    return lax.fori_loop(1, n, step, (k, v, acc))[2]


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def ring_attention(q: jax.Array, k: jax.Array, v: jax.Array, slopes: jax.Array | None,
                   scale: float) -> jax.Array:
    """Causal attention of the local q [b, 2c, h, d] over the whole ring's k, v
    [b, 2c, kv_h, d] (load-balanced order); ``slopes`` (ALiBi, [h]) get no gradient."""
    return _ring_fwd(q, k, v, slopes, scale)[0]


def _ring_fwd(q, k, v, slopes, scale):
    kvh = k.shape[2]
    out5, lse = _forward(blockwise.split_heads(q, kvh), k, v,
                         blockwise.group_slopes(slopes, kvh), scale)
    out = out5.reshape(q.shape).astype(q.dtype)
    return out, (q, k, v, slopes, out, lse)


def _ring_bwd(scale, residuals, do):
    q, k, v, slopes, out, lse = residuals
    n, r, kvh, c = lax.axis_size(AXIS), lax.axis_index(AXIS), k.shape[2], q.shape[1] // 2
    q5, do5 = blockwise.split_heads(q, kvh), blockwise.split_heads(do, kvh)
    slopes = blockwise.group_slopes(slopes, kvh)
    delta = jnp.einsum("bqhgd,bqhgd->bhgq", out.astype(jnp.float32).reshape(q5.shape),
                       do5.astype(jnp.float32))
    rows_a, rows_b = zip(*(_halves(x, c, 1) for x in (q5, do5)),
                         *(_halves(x, c, 3) for x in (lse, delta)))
    qa0, qb0 = _starts(r, n, c)

    def grads(rows, k, v, causal, shift):
        q_, do_, lse_, delta_ = rows
        return _block_grads(q_, k, v, do_, lse_, delta_, slopes, scale, causal, shift)
    (ka, kb), (va, vb) = _halves(k, c, 1), _halves(v, c, 1)
    aa, zero = grads(rows_a, ka, va, True, jnp.int32(0)), jnp.int32(0)
    ba, bb = grads(rows_b, ka, va, False, qa0 - qb0), grads(rows_b, kb, vb, True, zero)
    dqa, dqb = aa[0], ba[0] + bb[0]
    dk = jnp.concatenate([aa[1] + ba[1], bb[1]], 1)
    dv = jnp.concatenate([aa[2] + ba[2], bb[2]], 1)

    def step(t, carry):
        k, v, dk, dv, dqa, dqb = carry
        k, v, dk, dv = _shift((k, v, dk, dv), n)  # dk, dv travel with their blocks
        src = (r - t) % n
        ka0, kb0 = _starts(src, n, c)

        def earlier(k, v):
            (ka, _), (va, _) = _halves(k, c, 1), _halves(v, c, 1)
            ga = grads(rows_a, ka, va, False, ka0 - qa0)
            gb = grads(rows_b, ka, va, False, ka0 - qb0)
            pad = lambda x: jnp.concatenate([x, jnp.zeros_like(x)], 1)
            return ga[0], gb[0], pad(ga[1] + gb[1]), pad(ga[2] + gb[2])

        def later(k, v):
            (ka, kb), (va, vb) = _halves(k, c, 1), _halves(v, c, 1)
            g1 = grads(rows_b, ka, va, False, ka0 - qb0)
            g2 = grads(rows_b, kb, vb, False, kb0 - qb0)
            return (jnp.zeros_like(g1[0]), g1[0] + g2[0], jnp.concatenate([g1[1], g2[1]], 1),
                    jnp.concatenate([g1[2], g2[2]], 1))
        da, db, dk_t, dv_t = lax.cond(src < r, earlier, later, k, v)
        return k, v, dk + dk_t, dv + dv_t, dqa + da, dqb + db
    _, _, dk, dv, dqa, dqb = lax.fori_loop(1, n, step, (k, v, dk, dv, dqa, dqb))
    dk, dv = _shift((dk, dv), n)  # home: the last holder is the owner's predecessor
    dq = jnp.concatenate([dqa, dqb], 1).reshape(q.shape)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


ring_attention.defvjp(_ring_fwd, _ring_bwd)
