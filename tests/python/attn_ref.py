"""Naive attention in numpy, forward and backward, written from the semantics in
shared DESIGN.md (it shares no code with flashattn). Run in float64 it is the reference; run in
the input precision it is the "naive low-precision" baseline of the accuracy criterion

    max|ours - ref64| <= 2 * max|naive_lowp - ref64| + atol.

Layouts: q (batch, seqlen_q, heads, head_dim), k (batch, seqlen_k, heads_k, head_dim),
v (batch, seqlen_k, heads_k, head_dim_v); lse (batch, heads, seqlen_q).
"""

from __future__ import annotations

import numpy as np


def visible(seqlen_q, seqlen_k, causal=False, window=(-1, -1)):
    """Boolean (seqlen_q, seqlen_k): may query i see key j (bottom-right aligned)."""
    left, right = window
    if causal:
        left, right = -1, 0
    i = np.arange(seqlen_q)[:, None]
    j = np.arange(seqlen_k)[None, :]
    diag = i + seqlen_k - seqlen_q
    ok = np.ones((seqlen_q, seqlen_k), dtype=bool)
    if left >= 0:
        ok &= j >= diag - left
    if right >= 0:
        ok &= j <= diag + right
    return ok


def _expand_kv(x, heads):
    # (b, s, heads_k, d) -> (b, s, heads, d): query head h reads kv head h // (heads // heads_k)
    return np.repeat(x, heads // x.shape[2], axis=2)


def _fold_kv(dx, heads_k):
    # (b, s, heads, d) -> (b, s, heads_k, d), summing each GQA group
    b, s, h, d = dx.shape
    return dx.reshape(b, s, heads_k, h // heads_k, d).sum(axis=3)


def _scores(q, k, scale, softcap, alibi, mask):
    """Returns (x, s): x = scale * q.k (b, h, sq, sk), s after softcap, ALiBi and mask."""
    x = np.einsum("bihd,bjhd->bhij", q, k) * q.dtype.type(scale)
    s = softcap * np.tanh(x / softcap) if softcap > 0 else x
    sq, sk = x.shape[-2:]
    if alibi is not None:
        slopes = np.asarray(alibi, dtype=np.float64)
        slopes = np.broadcast_to(slopes, (x.shape[0], x.shape[1]))
        dist = np.abs(np.arange(sq)[:, None] + sk - sq - np.arange(sk)[None, :])
        s = s - (slopes[:, :, None, None] * dist).astype(x.dtype)
    s = np.where(mask, s, -np.inf)
    return x, s


def _with_sink(s, sink):
    """Scores with the learnable sink as one more column (its logit as given), or s."""
    if sink is None:
        return s
    col = np.broadcast_to(np.asarray(sink, dtype=s.dtype)[None, :, None, None], s.shape[:-1] + (1,))
    return np.concatenate([s, col], axis=-1)


def round_e4m3(x):
    """x rounded to the nearest float8_e4m3 (OCP E4M3FN) value, ties to even, saturating to
    +-448 (as PTX cvt.rn.satfinite); NaN stays NaN. float64 in, float64 out."""
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        # a = m * 2^e with m in [0.5, 1): a normal e4m3 has quantum 2^(e - 4), the subnormals 2^-9.
        _, e = np.frexp(a)
        quantum = np.ldexp(1.0, np.maximum(e - 1, -6) - 3)
        r = np.rint(a / quantum) * quantum  # rint: round half to even
    r = np.where(a >= 448.0, 448.0, r)
    return np.where(np.isnan(x), np.nan, np.copysign(r, x))


def forward(q, k, v, *, scale=None, causal=False, window=(-1, -1), softcap=0.0, alibi=None,
            dropout_p=0.0, keep=None, sink=None, dtype=np.float64, fp8_round_p=False):
    """Returns out (b, sq, h, dv) and lse (b, h, sq). keep: bool (b, h, sq, sk) dropout mask.
    sink: (h,) learnable sink logits (a softmax column without a value row), or None.
    fp8_round_p: the naive FP8 computation of docs/SEMANTICS.md ("FP8"): q, k, v are the
    dequantized values and each probability is rounded to e4m3 before P.V as
    e4m3(2^(x - r)), x the logit in log2 units, r = ceil(max visible x) - 8; out divides by the
    unrounded sum (with the sink)."""
    q, k, v = (np.asarray(t).astype(dtype) for t in (q, k, v))
    heads = q.shape[2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    k, v = _expand_kv(k, heads), _expand_kv(v, heads)
    mask = visible(q.shape[1], k.shape[1], causal, window)
    _, s = _scores(q, k, scale, softcap, alibi, mask)
    s = _with_sink(s, sink)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(s - m)
    denom = e.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(denom > 0, e / denom, 0)
        lse = np.where(denom[..., 0] > 0, np.log(denom[..., 0]) + m[..., 0], -np.inf)
    if sink is not None:
        p = p[..., :-1]
    if fp8_round_p:
        p = _fp8_weights(s, sink is not None)
    if dropout_p > 0:
        p = p * keep / dtype(1 - dropout_p)
    out = np.einsum("bhij,bjhd->bihd", p, v)
    return out, lse


def _fp8_weights(s, has_sink):
    """P.V's weights of the FP8 forward: e4m3(2^(x - r)) / L per row (see forward)."""
    x = s * (1.0 / np.log(2.0))  # log2 units; the sink column last when has_sink
    keys = x[..., :-1] if has_sink else x
    mx = keys.max(axis=-1, keepdims=True)
    r = np.where(np.isfinite(mx), np.ceil(mx) - 8.0, 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.where(np.isfinite(x), np.exp2(x - r), 0.0)
        total = e.sum(axis=-1, keepdims=True)
        w = round_e4m3(e[..., :-1] if has_sink else e)
        return np.where(np.isfinite(mx) & (total > 0), w / np.where(total > 0, total, 1.0), 0.0)


def backward(dout, q, k, v, *, scale=None, causal=False, window=(-1, -1), softcap=0.0,
             alibi=None, dropout_p=0.0, keep=None, sink=None, dtype=np.float64):
    """Returns dq, dk, dv (dk/dv summed over the query heads of each GQA group), and dsink
    (h,) after them when a sink is given."""
    q, k, v, dout = (np.asarray(t).astype(dtype) for t in (q, k, v, dout))
    heads, heads_k = q.shape[2], k.shape[2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    ke, ve = _expand_kv(k, heads), _expand_kv(v, heads)
    mask = visible(q.shape[1], k.shape[1], causal, window)
    x, s = _scores(q, ke, scale, softcap, alibi, mask)
    s = _with_sink(s, sink)
    m = s.max(axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    e = np.exp(s - m)
    denom = e.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(denom > 0, e / denom, 0)
    p_sink = None
    if sink is not None:
        p, p_sink = p[..., :-1], p[..., -1]
    z = keep / dtype(1 - dropout_p) if dropout_p > 0 else np.ones_like(p)
    dve = np.einsum("bhij,bihd->bjhd", p * z, dout)
    dp = np.einsum("bihd,bjhd->bhij", dout, ve) * z
    ds = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    if softcap > 0:
        ds = ds * (1 - np.tanh(x / softcap) ** 2)
    ds = ds * dtype(scale)
    dq = np.einsum("bhij,bjhd->bihd", ds, ke)
    dke = np.einsum("bhij,bihd->bjhd", ds, q)
    if sink is None:
        return dq, _fold_kv(dke, heads_k), _fold_kv(dve, heads_k)
    # The sink column: no value row, so dP = 0 there and dS_sink = -P_sink * sum_j P_j dP_j.
    dsink = -(p_sink * (p * dp).sum(axis=-1)).sum(axis=(0, 2))
    return dq, _fold_kv(dke, heads_k), _fold_kv(dve, heads_k), dsink


def assert_fa_close(name, ours, ref64, naive_lowp, atol):
    """FlashAttention's criterion; a NaN never passes."""
    ours = np.asarray(ours, dtype=np.float64)
    ref64 = np.asarray(ref64, dtype=np.float64)
    naive = np.asarray(naive_lowp, dtype=np.float64)
    assert ours.shape == ref64.shape, f"{name}: shape {ours.shape} != {ref64.shape}"
    assert not np.isnan(ours).any(), f"{name}: NaN in result"
    # Infinities (lse of rows with no visible key) must match exactly.
    inf = np.isinf(ref64)
    assert np.array_equal(np.isinf(ours), inf) and np.array_equal(ours[inf], ref64[inf]), \
        f"{name}: infinities differ"
    err = np.abs(ours[~inf] - ref64[~inf]).max(initial=0.0)
    base = np.abs(naive[~inf] - ref64[~inf]).max(initial=0.0)
    mean = np.abs(ours[~inf] - ref64[~inf]).mean() if (~inf).any() else 0.0
    assert err <= 2 * base + atol, (
        f"{name}: max error {err:.3g} (mean {mean:.3g}) > 2 * naive {base:.3g} + {atol:g}")
