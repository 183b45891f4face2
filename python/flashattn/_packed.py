"""The head split of a packed qkv of grouped heads, (batch, seqlen, num_heads_q + 2 * num_heads_k,
headdim): FlashAttention-3's 4-d qkvpacked layout and flash_attn's rotary helpers take it."""

from __future__ import annotations

from typing import Optional


def split_qkv_heads(qkv, num_heads_q: Optional[int], who: str):
    """(q, k, v) views of a 4-d packed qkv; ValueError naming `who` when num_heads_q is missing or
    does not leave two equal kv head counts."""
    if qkv.dim() != 4 or num_heads_q is None:
        raise ValueError(f"{who}: qkv must be (batch, seqlen, 3, nheads, headdim), or (batch, "
                         "seqlen, num_heads_q + 2 * num_heads_k, headdim) with num_heads_q given")
    num_heads_k = (qkv.shape[2] - num_heads_q) // 2
    if num_heads_q <= 0 or num_heads_k <= 0 or num_heads_q + 2 * num_heads_k != qkv.shape[2]:
        raise ValueError(f"{who}: qkv has {qkv.shape[2]} heads, which is not num_heads_q = "
                         f"{num_heads_q} plus twice a number of kv heads")
    return qkv.split([num_heads_q, num_heads_k, num_heads_k], dim=2)
