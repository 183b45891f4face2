"""Naive attention in torch (differentiable), written from the semantics in shared DESIGN.md.
In float64 it is the reference for values and gradients; in the input dtype it is the naive
low-precision baseline of the accuracy criterion (attn_ref.assert_fa_close)."""

import numpy as np
import torch

import attn_ref


def attention(q, k, v, *, scale=None, causal=False, window=(-1, -1), softcap=0.0, alibi=None,
              dropout_p=0.0, keep=None):
    """q (b, sq, h, d), k (b, sk, hk, d), v (b, sk, hk, dv) -> out (b, sq, h, dv), lse (b, h, sq).
    keep: bool (b, h, sq, sk) dropout keep mask."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    scale = d ** -0.5 if scale is None else scale
    k = k.repeat_interleave(h // hk, dim=2)
    v = v.repeat_interleave(h // hk, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if alibi is not None:
        slopes = alibi.to(s.dtype).expand(b, h)
        dist = torch.from_numpy(np.abs(np.arange(sq)[:, None] + sk - sq - np.arange(sk)[None, :]))
        s = s - slopes[:, :, None, None] * dist.to(device=s.device, dtype=s.dtype)
    mask = torch.from_numpy(attn_ref.visible(sq, sk, causal, window)).to(s.device)
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    # Rows with no visible key: softmax over zeros (no NaN, no gradient), then P = 0.
    has_key = mask.any(dim=-1)[:, None]
    p = torch.softmax(torch.where(has_key, s, torch.zeros_like(s)), dim=-1)
    p = torch.where(has_key, p, torch.zeros_like(p))
    if dropout_p > 0:
        p = p * keep.to(device=p.device, dtype=p.dtype) / (1 - dropout_p)
    out = torch.einsum("bhij,bjhd->bihd", p, v)
    return out, lse


def values_and_grads(fn, inputs, dout):
    """Runs fn(*inputs) -> out, backpropagates dout; returns [out, *grads] as numpy float64."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves)
    out.backward(dout.to(device=out.device, dtype=out.dtype))
    return [to_numpy(out)] + [to_numpy(t.grad) for t in leaves]


def to_numpy(t):
    return t.detach().double().cpu().numpy()
