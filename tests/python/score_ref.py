"""float64 references for the bias / mask / block-sparse tests (test_bias.py,
test_block_sparse.py), written from docs/SEMANTICS.md: the masks enter as one dense keep
array, the bias after softcap, and a row with no visible key gives out 0, lse -inf and zero
gradients. Shares no code with flashattn."""

import numpy as np


def dense_keep(b, h, sq, sk, causal, attn_mask, block_mask, block_size, window=(-1, -1)):
    """(b, h, sq, sk) bool: the visible pairs (bottom-right aligned causal / window), the block
    mask expanded to elements."""
    keep = np.ones((b, h, sq, sk), dtype=bool)
    left, right = (window[0], 0) if causal else window
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    diag = i + sk - sq
    if left >= 0:
        keep &= j >= diag - left
    if right >= 0:
        keep &= j <= diag + right
    if attn_mask is not None:
        keep &= np.broadcast_to(attn_mask.astype(bool), keep.shape)
    if block_mask is not None:
        bq, bk = block_size
        rows = np.arange(sq) // bq
        cols = np.arange(sk) // bk
        expanded = block_mask.astype(bool)[:, :, rows][:, :, :, cols]
        keep &= np.broadcast_to(expanded, keep.shape)
    return keep


def reference(q, k, v, dout, bias, keep, scale, softcap=0.0):
    """float64 out, lse (b, h, sq), dq, dk, dv and dS (b, h, sq, sk), the gradient of the
    score after softcap (= of the bias)."""
    q, k, v, dout = (x.astype(np.float64) for x in (q, k, v, dout))
    h, hk = q.shape[2], k.shape[2]
    ke, ve = np.repeat(k, h // hk, axis=2), np.repeat(v, h // hk, axis=2)
    s = scale * np.einsum("bihd,bjhd->bhij", q, ke)
    t = np.tanh(s / softcap) if softcap > 0 else None
    if softcap > 0:
        s = softcap * t
    if bias is not None:
        s = s + np.broadcast_to(bias.astype(np.float64), s.shape)
    s = np.where(keep & (s != -np.inf), s, -np.inf)
    m = s.max(axis=-1, keepdims=True, initial=-np.inf)  # -inf also for seqlen_k = 0
    empty = m == -np.inf
    e = np.where(empty, 0.0, np.exp(s - np.where(empty, 0.0, m)))
    l = e.sum(axis=-1, keepdims=True)
    p = np.where(empty, 0.0, e / np.where(empty, 1.0, l))
    lse = np.where(empty[..., 0], -np.inf, (m + np.log(np.where(empty, 1.0, l)))[..., 0])
    out = np.einsum("bhij,bjhd->bihd", p, ve)
    dp = np.einsum("bihd,bjhd->bhij", dout, ve)
    delta = np.einsum("bihd,bihd->bhi", dout, out)[..., None]
    ds = p * (dp - delta)
    dx = ds * (1 - t * t) if softcap > 0 else ds
    dq = scale * np.einsum("bhij,bjhd->bihd", dx, ke)
    dk = scale * np.einsum("bhij,bihd->bjhd", dx, q)
    dv = np.einsum("bhij,bihd->bjhd", p, dout)
    b, sk = k.shape[0], k.shape[1]
    dk = dk.reshape(b, sk, hk, h // hk, dk.shape[-1]).sum(axis=3)
    dv = dv.reshape(b, sk, hk, h // hk, dv.shape[-1]).sum(axis=3)
    return out, lse, dq, dk, dv, ds


def reduce_like(ds, shape):
    """dS summed over the dimensions a bias of `shape` broadcasts."""
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and ds.shape[i] != 1)
    return ds.sum(axis=axes, keepdims=True)


def close(ours, ref, what):
    """max |ours - ref| <= 1e-4 max |ref| + 1e-6 (float32 runs); infinities must match; a NaN
    never passes."""
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} != {ref.shape}"
    assert not np.isnan(ours).any(), f"{what}: NaN"
    finite = np.isfinite(ref)
    assert np.array_equal(ours[~finite], ref[~finite]), f"{what}: non-finite entries differ"
    scale = max(np.abs(ref[finite]).max(initial=0.0), 1e-3)
    err = np.abs(ours[finite] - ref[finite]).max(initial=0.0)
    assert err <= 1e-4 * scale + 1e-6, f"{what}: max error {err} (max |ref| {scale})"


def torch_reference(q, k, v, bias, keep, scale, softcap=0.0):
    """float64 torch attention (autograd through q, k, v and the bias); fully masked rows
    give 0."""
    import torch

    h, hk = q.shape[2], k.shape[2]
    ke = k.repeat_interleave(h // hk, dim=2)
    ve = v.repeat_interleave(h // hk, dim=2)
    s = scale * torch.einsum("bihd,bjhd->bhij", q, ke)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias
    s = s.masked_fill(~keep, float("-inf"))
    empty = torch.isinf(s).all(dim=-1, keepdim=True)
    p = torch.softmax(s.masked_fill(empty, 0.0), dim=-1).masked_fill(empty | ~keep, 0.0)
    # A float32 bias promotes the low-precision (naive) scores: P then meets V in V's dtype, as
    # a low-precision implementation would round it.
    return torch.einsum("bhij,bjhd->bihd", p.to(ve.dtype), ve)
