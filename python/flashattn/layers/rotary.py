"""Rotary position embedding with flash_attn 2.x's names, arguments and semantics
(``flash_attn.layers.rotary``: ``apply_rotary_emb`` (also as ``apply_rotary_emb_func``),
``apply_rotary_emb_qkv_``, ``apply_rotary_emb_kv_`` and the ``RotaryEmbedding`` module, with
its XPos scaling), in plain torch.

flash_attn computes it with a Triton kernel; here it is torch operations in float32, so it runs
on any device, under autograd (the gradient is the rotation by the opposite angle, which
autograd derives) and under ``torch.compile``. It is the rotation ``flash_attn_with_kvcache``
applies with ``rotary_cos``/``rotary_sin``, for code that rotates q and k itself.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor

from .._packed import split_qkv_heads

__all__ = ["RotaryEmbedding", "apply_rotary_emb", "apply_rotary_emb_func", "apply_rotary_emb_kv_",
           "apply_rotary_emb_qkv_"]


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


# flash_attn's older name for the same function.
apply_rotary_emb_func = apply_rotary_emb


def _qk_views(qkv: Tensor, num_heads_q: Optional[int]):
    """The q and k parts of a packed qkv, as views: (batch, seqlen, 3, nheads, headdim), or
    (batch, seqlen, num_heads_q + 2 * num_heads_k, headdim) with num_heads_q."""
    if qkv.dim() == 5:
        if qkv.shape[2] != 3:
            raise ValueError(f"qkv must be (batch, seqlen, 3, nheads, headdim), got shape "
                             f"{tuple(qkv.shape)}")
        return qkv[:, :, 0], qkv[:, :, 1]
    q, k, _ = split_qkv_heads(qkv, num_heads_q, "apply_rotary_emb_qkv_")
    return q, k


def apply_rotary_emb_qkv_(qkv: Tensor, cos: Tensor, sin: Tensor, cos_k: Optional[Tensor] = None,
                          sin_k: Optional[Tensor] = None, interleaved: bool = False,
                          seqlen_offsets: Union[int, Tensor] = 0,
                          num_heads_q: Optional[int] = None) -> Tensor:
    """Rotates q and k of a packed qkv in place (v untouched) and returns qkv: k with cos_k /
    sin_k when given (XPos), else with cos / sin. Layouts as in ``_qk_views``."""
    q, k = _qk_views(qkv, num_heads_q)
    apply_rotary_emb(q, cos, sin, interleaved, True, seqlen_offsets)
    apply_rotary_emb(k, cos if cos_k is None else cos_k, sin if sin_k is None else sin_k,
                     interleaved, True, seqlen_offsets)
    return qkv


def apply_rotary_emb_kv_(kv: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False,
                         seqlen_offsets: Union[int, Tensor] = 0) -> Tensor:
    """Rotates k of a packed kv (batch, seqlen, 2, nheads, headdim) in place; returns kv."""
    if kv.dim() != 5 or kv.shape[2] != 2:
        raise ValueError(f"kv must be (batch, seqlen, 2, nheads, headdim), got shape "
                         f"{tuple(kv.shape)}")
    apply_rotary_emb(kv[:, :, 0], cos, sin, interleaved, True, seqlen_offsets)
    return kv


class RotaryEmbedding(torch.nn.Module):
    """flash_attn's rotary module: angle t * base^(-2i / dim) for position t and channel pair i,
    the cos / sin tables cached up to the longest position seen (in the input's dtype, computed
    in float32), applied in place to packed qkv or to q and kv. scale_base switches on XPos
    (Sun et al., 2022): q is scaled by zeta_i^((t - L / 2) / scale_base) and k by its inverse,
    zeta_i = (2i + 0.4 dim) / (1.4 dim), L the cached length, as flash_attn does."""

    def __init__(self, dim: int, base: float = 10000.0, interleaved: bool = False,
                 scale_base: Optional[float] = None, pos_idx_in_fp32: bool = True, device=None):
        super().__init__()
        self.dim = dim
        self.base = float(base)
        self.interleaved = interleaved
        self.scale_base = scale_base
        # False: positions in inv_freq's dtype (a module cast to bfloat16 rounds them), as
        # flash_attn does; True (the default): float32 positions and frequencies.
        self.pos_idx_in_fp32 = pos_idx_in_fp32
        self.register_buffer("inv_freq", self._inv_freq(device), persistent=False)
        self.register_buffer("scale", self._zeta(device) if scale_base is not None else None,
                             persistent=False)
        self._seq_len_cached = 0
        self._cos_cached = self._sin_cached = None
        self._cos_k_cached = self._sin_k_cached = None

    def _inv_freq(self, device=None) -> Tensor:
        exponent = torch.arange(0, self.dim, 2, device=device, dtype=torch.float32) / self.dim
        return 1.0 / (self.base ** exponent)

    def _zeta(self, device=None) -> Tensor:
        pairs = torch.arange(0, self.dim, 2, device=device, dtype=torch.float32)
        return (pairs + 0.4 * self.dim) / (1.4 * self.dim)

    def _update_cos_sin_cache(self, seqlen: int, device=None, dtype=None) -> None:
        cached = self._cos_cached
        if (cached is not None and seqlen <= self._seq_len_cached and cached.device == device
                and cached.dtype == dtype and not (self.training and cached.is_inference())):
            return
        self._seq_len_cached = seqlen
        # float32 (positions times frequencies are large numbers) unless pos_idx_in_fp32 is
        # False; the buffers may have been cast to a half dtype with the module.
        if self.pos_idx_in_fp32:
            inv_freq = self.inv_freq if self.inv_freq.dtype == torch.float32 else self._inv_freq(device)
            t = torch.arange(seqlen, device=device, dtype=torch.float32)
        else:
            inv_freq = self.inv_freq
            t = torch.arange(seqlen, device=device, dtype=inv_freq.dtype)
        freqs = torch.outer(t, inv_freq.to(device))
        cos, sin = torch.cos(freqs), torch.sin(freqs)
        if self.scale is None:
            self._cos_cached, self._sin_cached = cos.to(dtype), sin.to(dtype)
            return
        zeta = self.scale if self.scale.dtype == torch.float32 else self._zeta(self.scale.device)
        t_centered = torch.arange(seqlen, dtype=torch.float32, device=device) - seqlen // 2
        power = t_centered / self.scale_base
        scale = zeta.to(device) ** power[:, None]
        self._cos_cached, self._sin_cached = (cos * scale).to(dtype), (sin * scale).to(dtype)
        self._cos_k_cached, self._sin_k_cached = (cos / scale).to(dtype), (sin / scale).to(dtype)

    def forward(self, qkv: Tensor, kv: Optional[Tensor] = None,
                seqlen_offset: Union[int, Tensor] = 0, max_seqlen: Optional[int] = None,
                num_heads_q: Optional[int] = None):
        """qkv: packed (``apply_rotary_emb_qkv_``'s layouts), or q (batch, seqlen, nheads,
        headdim) when kv (batch, seqlen, 2, nheads_k, headdim) is given. seqlen_offset: an int
        or a (batch,) tensor of position offsets; with a tensor pass max_seqlen, the length the
        tables must cover. Rotates in place; returns qkv, or (q, kv)."""
        if max_seqlen is not None:
            self._update_cos_sin_cache(max_seqlen, device=qkv.device, dtype=qkv.dtype)
        elif isinstance(seqlen_offset, int):
            self._update_cos_sin_cache(qkv.shape[1] + seqlen_offset, device=qkv.device,
                                       dtype=qkv.dtype)
        elif self._cos_cached is None:
            raise ValueError("RotaryEmbedding: a tensor seqlen_offset needs max_seqlen (the table "
                             "length) on the first call")
        xpos = self.scale is not None
        cos_k = self._cos_k_cached if xpos else self._cos_cached
        sin_k = self._sin_k_cached if xpos else self._sin_cached
        if kv is None:
            return apply_rotary_emb_qkv_(qkv, self._cos_cached, self._sin_cached, cos_k, sin_k,
                                         self.interleaved, seqlen_offset, num_heads_q)
        q = apply_rotary_emb(qkv, self._cos_cached, self._sin_cached, self.interleaved, True,
                             seqlen_offset)
        return q, apply_rotary_emb_kv_(kv, cos_k, sin_k, self.interleaved, seqlen_offset)
