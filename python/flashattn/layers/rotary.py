"""Rotary position embedding with flash_attn 2.x's name, arguments and semantics
(``flash_attn.layers.rotary.apply_rotary_emb``), in plain torch.

flash_attn computes it with a Triton kernel; here it is torch operations in float32, so it runs
on any device, under autograd (the gradient is the rotation by the opposite angle, which
autograd derives) and under ``torch.compile``. It is the rotation ``flash_attn_with_kvcache``
applies with ``rotary_cos``/``rotary_sin``, for code that rotates q and k itself.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor

__all__ = ["apply_rotary_emb"]


def _positions(x: Tensor, seqlen_offsets: Union[int, Tensor], cu_seqlens: Optional[Tensor]):
    """The rotary position of every token, int64: (batch, seqlen) for x (batch, seqlen, ...), or
    (total,) for varlen x (total, ...), where rows past cu_seqlens[-1] get -1 (not rotated)."""
    device = x.device
    if cu_seqlens is None:
        batch, seqlen = x.shape[0], x.shape[1]
        pos = torch.arange(seqlen, device=device).expand(batch, seqlen)
        if isinstance(seqlen_offsets, Tensor):
            return pos + seqlen_offsets.to(device=device, dtype=torch.int64).view(batch, 1)
        return pos + int(seqlen_offsets)
    cu = cu_seqlens.to(device=device, dtype=torch.int64)
    batch = cu.numel() - 1
    token = torch.arange(x.shape[0], device=device)
    # Sequence of each row: how many sequence ends lie at or before it.
    seq = torch.searchsorted(cu[1:], token, right=True)
    inside = seq < batch
    seq = seq.clamp(max=max(batch - 1, 0))
    if isinstance(seqlen_offsets, Tensor):
        offset = seqlen_offsets.to(device=device, dtype=torch.int64)[seq]
    else:
        offset = int(seqlen_offsets)
    pos = token - cu[seq] + offset
    return torch.where(inside, pos, torch.full_like(pos, -1))


def apply_rotary_emb(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False,
                     inplace: bool = False, seqlen_offsets: Union[int, Tensor] = 0,
                     cu_seqlens: Optional[Tensor] = None,
                     max_seqlen: Optional[int] = None) -> Tensor:
    """Rotates the first rotary_dim = 2 * cos.shape[-1] channels of x; the rest pass through.

    x: (batch, seqlen, nheads, headdim), or (total, nheads, headdim) with cu_seqlens int32
    (batch + 1) and max_seqlen. cos, sin: (seqlen_ro, rotary_dim / 2); the token at index t of
    sequence b uses row t + seqlen_offsets[b] (seqlen_offsets an int or an int (batch,) tensor,
    e.g. the KV-cache lengths). Rows past the table (possible only with tensor offsets, which
    are not read on the host) are left unrotated, as flash_attn's kernel leaves them.
    interleaved=False rotates the pairs (i, i + rotary_dim / 2) (GPT-NeoX); True rotates
    (2i, 2i + 1) (GPT-J). Computed in float32, returned in x's dtype; inplace=True writes into
    x and returns it.
    """
    varlen = cu_seqlens is not None
    if x.dim() != (3 if varlen else 4):
        layout = "(total, nheads, headdim)" if varlen else "(batch, seqlen, nheads, headdim)"
        raise ValueError(f"apply_rotary_emb: x must be {layout}, got shape {tuple(x.shape)}")
    if cos.dim() != 2 or cos.shape != sin.shape:
        raise ValueError(f"apply_rotary_emb: cos and sin must both be (seqlen_ro, rotary_dim / 2), "
                         f"got {tuple(cos.shape)} and {tuple(sin.shape)}")
    seqlen_ro, half = cos.shape
    rotary_dim = 2 * half
    if rotary_dim > x.shape[-1]:
        raise ValueError(f"apply_rotary_emb: rotary_dim = 2 * cos.shape[1] = {rotary_dim} must be "
                         f"<= headdim = {x.shape[-1]}")
    if varlen and max_seqlen is None:
        raise ValueError("apply_rotary_emb: cu_seqlens needs max_seqlen")
    seqlen = max_seqlen if varlen else x.shape[1]
    if seqlen_ro < seqlen:
        raise ValueError(f"apply_rotary_emb: cos has {seqlen_ro} rows, fewer than seqlen = "
                         f"{seqlen}")
    if not isinstance(seqlen_offsets, Tensor) and seqlen_offsets + seqlen > seqlen_ro:
        raise ValueError(f"apply_rotary_emb: seqlen_offsets + seqlen = {seqlen_offsets + seqlen} "
                         f"is beyond the {seqlen_ro} rows of cos/sin")

    pos = _positions(x, seqlen_offsets, cu_seqlens)
    valid = (pos >= 0) & (pos < seqlen_ro)
    row = pos.clamp(0, max(seqlen_ro - 1, 0))
    # (..., 1, rotary_dim / 2): one angle per token and channel pair, shared by the heads.
    c = torch.where(valid[..., None], cos.to(torch.float32)[row], 1.0).unsqueeze(-2)
    s = torch.where(valid[..., None], sin.to(torch.float32)[row], 0.0).unsqueeze(-2)

    xr = x[..., :rotary_dim].to(torch.float32)
    if interleaved:
        x0, x1 = xr[..., 0::2], xr[..., 1::2]
    else:
        x0, x1 = xr[..., :half], xr[..., half:]
    o0 = x0 * c - x1 * s
    o1 = x0 * s + x1 * c
    if interleaved:
        rotated = torch.stack((o0, o1), dim=-1).flatten(-2)
    else:
        rotated = torch.cat((o0, o1), dim=-1)
    rotated = rotated.to(x.dtype)
    if inplace:
        x[..., :rotary_dim].copy_(rotated)
        return x
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)
