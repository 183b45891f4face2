"""Padding helpers with flash_attn 2.x's names and semantics (``flash_attn.bert_padding``), so
code that turns a padded batch into the varlen layout and back runs unchanged:

    rows, indices, cu_seqlens, max_seqlen, seqused = unpad_input(x, attention_mask)
    out_rows = flash_attn_varlen_func(q_rows, k_rows, v_rows, cu_seqlens, cu_seqlens,
                                      max_seqlen, max_seqlen)
    out = pad_input(out_rows, indices, batch, seqlen)

torch only. Every function is differentiable (plain torch indexing ops, so autograd and
``torch.compile`` see ordinary operations); padded positions get zero gradients.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["index_first_axis", "pad_input", "unpad_input"]


def index_first_axis(x: Tensor, indices: Tensor) -> Tensor:
    """``x[indices]`` along the first axis: x (n, ...), indices int64 (m,) -> (m, ...)."""
    if x.dim() < 2:
        raise ValueError(f"index_first_axis: x must have at least 2 dimensions, got shape "
                         f"{tuple(x.shape)}")
    return x.index_select(0, indices)


def unpad_input(hidden_states: Tensor, attention_mask: Tensor, unused_mask: Tensor = None):
    """Keeps the tokens the mask selects, in batch-major order.

    hidden_states: (batch, seqlen, ...). attention_mask: (batch, seqlen), bool or 0/1 ints,
    True = a real token. unused_mask (optional, same shape): tokens that are allocated but
    unused; they are kept as rows (and counted in cu_seqlens) but not in seqused.

    Returns (rows (total, ...), indices int64 (total,) into the flattened (batch * seqlen)
    positions, cu_seqlens int32 (batch + 1), max_seqlen int, seqused int32 (batch,)).
    """
    if attention_mask.dim() != 2 or tuple(attention_mask.shape) != tuple(hidden_states.shape[:2]):
        raise ValueError(f"unpad_input: attention_mask must have shape (batch, seqlen) = "
                         f"{tuple(hidden_states.shape[:2])}, got {tuple(attention_mask.shape)}")
    selected = attention_mask.bool()
    if unused_mask is not None:
        selected = selected | unused_mask.bool()
    seqlens = selected.sum(dim=-1, dtype=torch.int32)
    seqused = attention_mask.bool().sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(selected.flatten(), as_tuple=False).flatten()
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    # An empty batch has no longest sequence; 0 is what the attention functions expect then.
    max_seqlen = int(seqlens.max()) if seqlens.numel() else 0
    rows = index_first_axis(hidden_states.reshape(-1, *hidden_states.shape[2:]), indices)
    return rows, indices, cu_seqlens, max_seqlen, seqused


def pad_input(hidden_states: Tensor, indices: Tensor, batch: int, seqlen: int) -> Tensor:
    """The inverse of unpad_input: rows (total, ...) back to (batch, seqlen, ...), zeros at the
    positions ``indices`` does not name."""
    rest = hidden_states.shape[1:]
    out = hidden_states.new_zeros(batch * seqlen, *rest)
    # index_copy (not in place on a leaf) keeps the gradient path to hidden_states.
    return out.index_copy(0, indices, hidden_states).view(batch, seqlen, *rest)
