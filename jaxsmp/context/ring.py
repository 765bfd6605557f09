"""Ring attention over the ``cp`` axis, on the load-balanced order of :mod:`.layout`.

Called inside a ``shard_map`` manual over ``cp``: each device holds its query block and
passes key/value blocks around the ring with ``ppermute``; partial results are combined
by their log-sum-exp. Device ``r`` holds sequence chunks ``r`` and ``2·cp-1-r``
(``c`` tokens each). At ring step ``t`` it holds the key/value chunks of device
``src = r - t``: at ``t = 0`` its own (two diagonal blocks and one full one); for
``src < r`` every local query sees the first of them and none the second; for
``src > r`` only the second query chunk sees both. So every device computes the same
``2c²`` scores per step and blocks that the causal mask hides entirely are never
computed. The backward pass (a custom VJP, FlashAttention's: recompute each block from
the saved output and log-sum-exp) sends the key/value blocks around the ring again
with their gradient accumulators, which a last ``ppermute`` brings home.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels.vma import match_vma

AXIS = "cp"


def _f32(x) -> jnp.dtype:
    """Accumulation dtype: float32, or float64 for float64 inputs (the tests' reference)."""
    return jnp.promote_types(x.dtype, jnp.float32)


def _scores(q5, k, q_pos, k_pos, scale, slopes, diagonal):
    """q5 [b, sq, kvh, g, d], k [b, sk, kvh, d] -> float32 [b, kvh, g, sq, sk]."""
    s = jnp.einsum("bqhgd,bkhd->bhgqk", q5, k, preferred_element_type=_f32(q5)) * scale
    if slopes is not None:
        s = s + slopes.astype(s.dtype)[None, :, :, None, None] * (k_pos[None, :] - q_pos[:, None])
    if diagonal:
        s = jnp.where(q_pos[:, None] >= k_pos[None, :], s, -jnp.inf)
    return s


def _block(q5, k, v, q_pos, k_pos, scale, slopes, diagonal):
    """(out float32 [b, sq, kvh, g, d], lse [b, kvh, g, sq]) of one block; every query
    row sees at least one key (diagonal blocks: itself)."""
    s = _scores(q5, k, q_pos, k_pos, scale, slopes, diagonal)
    lse = jax.nn.logsumexp(s, axis=-1)
    p = jnp.exp(s - lse[..., None])
    out = jnp.einsum("bhgqk,bkhd->bqhgd", p.astype(v.dtype), v, preferred_element_type=_f32(v))
    return out, lse


def _block_grads(q5, k, v, do5, lse, delta, q_pos, k_pos, scale, slopes, diagonal):
    """(dq5, dk, dv) in float32 of one block, from the final ``lse`` of its queries."""
    s = _scores(q5, k, q_pos, k_pos, scale, slopes, diagonal)
    p = jnp.exp(s - lse[..., None])
    acc = _f32(q5)
    dp = jnp.einsum("bqhgd,bkhd->bhgqk", do5, v, preferred_element_type=acc)
    ds = p * (dp - delta[..., None])
    dv = jnp.einsum("bhgqk,bqhgd->bkhd", p.astype(do5.dtype), do5, preferred_element_type=acc)
    dk = jnp.einsum("bhgqk,bqhgd->bkhd", ds.astype(q5.dtype), q5,
                    preferred_element_type=acc) * scale
    dq = jnp.einsum("bhgqk,bkhd->bqhgd", ds.astype(k.dtype), k,
                    preferred_element_type=acc) * scale
    return dq, dk, dv


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


def _positions(r, n: int, c: int):
    """Global positions of the two chunks device ``r`` holds."""
    return r * c + jnp.arange(c), (2 * n - 1 - r) * c + jnp.arange(c)


def _pad_rows(x, c: int, first: bool):
    """``x`` (c query rows on axis 1, or on axis 3 for an lse) placed in 2c rows: the
    other half zeros (out) or -inf (lse)."""
    axis = 3 if x.ndim == 4 else 1
    fill = jnp.full_like(x, -jnp.inf if axis == 3 else 0.0)
    return jnp.concatenate([x, fill] if first else [fill, x], axis=axis)


def _forward(q5, k, v, slopes, scale):
    n = lax.axis_size(AXIS)
    r = lax.axis_index(AXIS)
    c = q5.shape[1] // 2
    qa, qb = q5[:, :c], q5[:, c:]
    pa, pb = _positions(r, n, c)
    block = functools.partial(_block, scale=scale, slopes=slopes)
    out_b = _merge(block(qb, k[:, :c], v[:, :c], pb, pa, diagonal=False),
                   block(qb, k[:, c:], v[:, c:], pb, pb, diagonal=True))
    out_a = block(qa, k[:, :c], v[:, :c], pa, pa, diagonal=True)
    acc = (jnp.concatenate([out_a[0], out_b[0]], 1), jnp.concatenate([out_a[1], out_b[1]], 3))
    q_pos = jnp.concatenate([pa, pb])
    for t in range(1, n):
        k, v = _shift((k, v), n)
        src = (r - t) % n
        ka_pos, kb_pos = _positions(src, n, c)

        def earlier(k, v):  # every query sees the first key chunk, none the second
            return block(q5, k[:, :c], v[:, :c], q_pos, ka_pos, diagonal=False)

        def later(k, v):  # only the second query chunk sees keys, both chunks
            o, lse = block(qb, k, v, pb, jnp.concatenate([ka_pos, kb_pos]), diagonal=False)
            return _pad_rows(o, c, first=False), _pad_rows(lse, c, first=False)
        acc = _merge(acc, lax.cond(src < r, earlier, later, k, v))
    return acc


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def ring_attention(q: jax.Array, k: jax.Array, v: jax.Array, slopes: jax.Array | None,
                   scale: float) -> jax.Array:
    """Causal attention of the local q [b, 2c, h, d] over the whole ring's k, v
    [b, 2c, kv_h, d] (load-balanced order); ``slopes`` (ALiBi, [h]) get no gradient."""
    return _ring_fwd(q, k, v, slopes, scale)[0]


def _split(q, kvh):
    b, s, h, d = q.shape
    return q.reshape(b, s, kvh, h // kvh, d)


def _grouped(slopes, kvh):
    return None if slopes is None else slopes.astype(jnp.float32).reshape(kvh, -1)


def _ring_fwd(q, k, v, slopes, scale):
    kvh = k.shape[2]
    out5, lse = _forward(_split(q, kvh), k, v, _grouped(slopes, kvh), scale)
    out = out5.reshape(q.shape).astype(q.dtype)
    return out, (q, k, v, slopes, out, lse)


def _ring_bwd(scale, residuals, do):
    q, k, v, slopes, out, lse = residuals
    n, r, kvh = lax.axis_size(AXIS), lax.axis_index(AXIS), k.shape[2]
    c = q.shape[1] // 2
    q5, do5, slopes = _split(q, kvh), _split(do, kvh), _grouped(slopes, kvh)
    acc = _f32(q)
    delta = jnp.einsum("bqhgd,bqhgd->bhgq", out.astype(acc).reshape(q5.shape), do5.astype(acc))
    pa, pb = _positions(r, n, c)
    q_pos = jnp.concatenate([pa, pb])
    grads = functools.partial(_block_grads, scale=scale, slopes=slopes)

    def rows(x, lo, hi):  # query rows of q5/do5 (axis 1) or lse/delta (axis 3)
        return x[:, lo:hi] if x.ndim == 5 else x[..., lo:hi]

    def part(lo, hi, k, v, k_pos, diagonal):
        return grads(rows(q5, lo, hi), k, v, rows(do5, lo, hi), rows(lse, lo, hi),
                     rows(delta, lo, hi), q_pos[lo:hi], k_pos, diagonal=diagonal)

    zeros = lambda x: match_vma(jnp.zeros(x.shape, acc), q, k, v, do)  # noqa: E731
    dq, dk, dv = zeros(q5), zeros(k), zeros(v)
    # t = 0: (a, a) and (b, b) diagonal, (b, a) full
    for lo, hi, klo, khi, diagonal in ((0, c, 0, c, True), (c, 2 * c, 0, c, False),
                                       (c, 2 * c, c, 2 * c, True)):
        g = part(lo, hi, k[:, klo:khi], v[:, klo:khi], q_pos[klo:khi], diagonal)
        dq, dk, dv = (dq.at[:, lo:hi].add(g[0]), dk.at[:, klo:khi].add(g[1]),
                      dv.at[:, klo:khi].add(g[2]))
    for t in range(1, n):
        k, v, dk, dv = _shift((k, v, dk, dv), n)
        src = (r - t) % n
        ka_pos, kb_pos = _positions(src, n, c)

        def earlier(k, v):
            g = part(0, 2 * c, k[:, :c], v[:, :c], ka_pos, False)
            pad = lambda x: jnp.concatenate([x, jnp.zeros_like(x)], 1)  # noqa: E731
            return g[0], pad(g[1]), pad(g[2])

        def later(k, v):
            g = part(c, 2 * c, k, v, jnp.concatenate([ka_pos, kb_pos]), False)
            return jnp.concatenate([jnp.zeros_like(g[0]), g[0]], 1), g[1], g[2]
        g = lax.cond(src < r, earlier, later, k, v)
        dq, dk, dv = dq + g[0], dk + g[1], dv + g[2]
    dk, dv = _shift((dk, dv), n)  # home: the last holder is the owner's predecessor
    return dq.reshape(q.shape).astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


ring_attention.defvjp(_ring_fwd, _ring_bwd)
