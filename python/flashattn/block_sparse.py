"""Block-sparse masks in compressed form (issue 18), and the builders that make them.

``BlockMask`` holds FlexAttention's ``BlockMask`` layout: for query block ``r`` of (batch ``b``,
head ``h``) the key blocks ``kv_indices[b, h, r, :kv_num_blocks[b, h, r]]`` are *partial* (the
element mask ``mask`` decides inside them) and ``full_kv_indices[b, h, r,
:full_kv_num_blocks[b, h, r]]`` are *full* (every pair visible; ``mask`` is not read there);
every other block is absent and skipped. Pass it as ``block_mask=`` to any attention function;
its ``block_size`` and ``mask`` come with it (docs/SEMANTICS.md, "Compressed block mask").

The builders use plain torch ops on the device of their inputs (the GPU for GPU tensors):

* ``block_mask_from_dense(block_mask, block_size, attn_mask=None)``: from the dense
  (batch|1, heads|1, q_blocks, k_blocks) form, each kept block classified full / partial /
  absent by the element mask when one is given;
* ``block_mask_from_mask_mod(mask_mod, B, H, Q_LEN, KV_LEN, block_size)``: from a FlexAttention
  ``mask_mod(b, h, q_idx, kv_idx)`` predicate, evaluated on every element (not on block
  corners, which misclassify any predicate that is not monotone inside a block, e.g. document
  masks or dilated patterns);
* ``block_mask_from_flex(block_mask)``: from a ``torch.nn.attention.flex_attention.BlockMask``
  (its lists as they are, its ``mask_mod`` evaluated into the element mask when some block is
  partial).

This module imports torch only inside the builders; ``BlockMask`` itself holds any arrays
(numpy arrays work with the numpy entry points).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Tuple


class BlockMask(NamedTuple):
    """The compressed block mask (FlexAttention's layout; see the module docs).

    kv_num_blocks: int32 (B|1, H|1, ceil(Q_LEN / bq)), kv_indices: int32 (B|1, H|1,
    ceil(Q_LEN / bq), width): the partial blocks (None: there are none).
    full_kv_num_blocks, full_kv_indices: the same for the full blocks (None: none).
    block_size: (bq, bk). mask: bool (B|1, H|1, >= Q_LEN, >= KV_LEN), the element mask of the
    partial blocks, or None (partial blocks are then fully visible); a call uses its first
    seqlen_q rows and seqlen_k columns (varlen: max_seqlen_q/k, positions inside each sequence).
    """

    kv_num_blocks: Optional[Any]
    kv_indices: Optional[Any]
    full_kv_num_blocks: Optional[Any]
    full_kv_indices: Optional[Any]
    block_size: Tuple[int, int]
    mask: Optional[Any] = None


def _pair(block_size) -> Tuple[int, int]:
    if isinstance(block_size, int):
        bq = bk = block_size
    else:
        try:
            bq, bk = block_size
        except (TypeError, ValueError):
            raise ValueError(f"block_size must be an int or a pair (bq, bk), got "
                             f"{block_size!r}") from None
    bq, bk = int(bq), int(bk)
    if bq < 1 or bk < 1:  # (a size 0 would divide by zero on the way)
        raise ValueError(f"block_size must be >= 1, got {block_size!r}")
    return bq, bk


# mask_mod evaluation: rows per chunk so that one chunk has about this many elements (vmap's
# intermediates are int64, so a chunk costs ~8x this in bytes).
_CHUNK_ELEMENTS = 1 << 24


def _evaluate_mask_mod(mask_mod: Callable, B: int, H: int, Q_LEN: int, KV_LEN: int, device,
                       row_multiple: int):
    """mask_mod on every (b, h, q_idx, kv_idx): bool (B, H, Q_LEN, KV_LEN) on device, through
    FlexAttention's own create_mask (vmap with tensor indexing, as flex_attention evaluates it),
    a chunk of query rows (a multiple of row_multiple) at a time."""
    import torch

    try:
        from torch.nn.attention.flex_attention import create_mask
    except ImportError:  # pragma: no cover - torch < 2.5
        raise NotImplementedError(
            "evaluating a mask_mod needs torch >= 2.5 (torch.nn.attention.flex_attention), found "
            f"{torch.__version__}") from None
    per_row = max(1, B * H * KV_LEN)
    rows = max(row_multiple, _CHUNK_ELEMENTS // per_row // row_multiple * row_multiple)
    chunks = []
    for q0 in range(0, Q_LEN, rows):
        def shifted(b, h, q_idx, kv_idx, q0=q0):
            return mask_mod(b, h, q_idx + q0, kv_idx)

        chunks.append(create_mask(shifted, B, H, min(rows, Q_LEN - q0), KV_LEN, device=device))
    if not chunks:
        return torch.zeros((B, H, 0, KV_LEN), dtype=torch.bool, device=device)
    return torch.cat(chunks, dim=2) if len(chunks) > 1 else chunks[0]


def _block_states(elem, bq: int, bk: int, keep_blocks=None):
    """(full, partial): bool (.., ceil(Q / bq), ceil(KV / bk)) from the element mask elem (bool
    (.., Q, KV)): a block is full if elem keeps every element of it, absent if none, partial
    otherwise (the last blocks may be smaller). keep_blocks (bool, broadcastable): blocks
    outside it are absent whatever elem says."""
    import torch

    *lead, Q, KV = elem.shape
    nqb, nkb = -(-Q // bq), -(-KV // bk)
    padded = torch.nn.functional.pad(elem.to(torch.uint8), (0, nkb * bk - KV, 0, nqb * bq - Q))
    kept = padded.reshape(*lead, nqb, bq, nkb, bk).sum(dim=(-3, -1), dtype=torch.int32)
    rows = (Q - torch.arange(nqb, device=elem.device) * bq).clamp(max=bq)
    cols = (KV - torch.arange(nkb, device=elem.device) * bk).clamp(max=bk)
    size = (rows[:, None] * cols[None, :]).to(torch.int32)
    full = kept == size
    partial = (kept > 0) & ~full
    if keep_blocks is not None:
        keep_blocks = keep_blocks.to(torch.bool)
        full, partial = full & keep_blocks, partial & keep_blocks
    return full, partial


def _lists(blocks):
    """Flex's (num_blocks int32 (.., rows), indices int32 (.., rows, cols)) of a bool block
    table: each row's set blocks first, in increasing order."""
    import torch

    num = blocks.sum(dim=-1, dtype=torch.int32)
    indices = torch.argsort(blocks.to(torch.uint8), dim=-1, descending=True, stable=True)
    return num.contiguous(), indices.to(torch.int32).contiguous()


def _compressed(full, partial, block_size: Tuple[int, int], elem) -> BlockMask:
    """The BlockMask of a (full, partial) block classification; elem (the element mask) is
    kept only when some block is partial."""
    kv_num, kv_idx = _lists(partial)
    full_num, full_idx = _lists(full)
    mask = elem if elem is not None and bool(partial.any()) else None
    return BlockMask(kv_num, kv_idx, full_num, full_idx, block_size, mask)


def block_mask_from_dense(block_mask, block_size, attn_mask=None) -> BlockMask:
    """The compressed form of a dense block mask.

    block_mask: bool/uint8 torch tensor (B|1, H|1, ceil(seqlen_q / bq), ceil(seqlen_k / bk)),
    nonzero = kept; block_size: int or (bq, bk). attn_mask: optional bool (B|1, H|1, seqlen_q,
    seqlen_k), the element mask inside kept blocks. Without it every kept block is full; with
    it a kept block is full where attn_mask keeps all of it, absent where it keeps none,
    partial otherwise, and attn_mask becomes the result's element mask (when a block is
    partial). The result describes exactly the mask of ``block_mask=block_mask,
    attn_mask=attn_mask``. Torch ops on block_mask's device.
    """
    import torch

    bq, bk = _pair(block_size)
    if block_mask.dim() != 4:
        raise ValueError(f"block_mask must have 4 dimensions (B|1, H|1, ceil(seqlen_q / bq), "
                         f"ceil(seqlen_k / bk)), got shape {tuple(block_mask.shape)}")
    kept = block_mask.to(torch.bool)
    if attn_mask is None:
        return _compressed(kept, torch.zeros_like(kept), (bq, bk), None)
    full, partial = _block_states(attn_mask.to(kept.device), bq, bk, keep_blocks=kept)
    return _compressed(full, partial, (bq, bk), attn_mask)


def block_mask_from_mask_mod(mask_mod: Callable, B: Optional[int], H: Optional[int], Q_LEN: int,
                             KV_LEN: int, block_size=128, *, device="cuda") -> BlockMask:
    """The compressed block mask of a FlexAttention mask_mod ``(b, h, q_idx, kv_idx) -> bool``.

    B, H: batch and heads (None = 1: the predicate does not depend on it, the result
    broadcasts). Q_LEN, KV_LEN: the sequence lengths (varlen: the longest; positions inside
    each sequence). block_size: int or (bq, bk). device: where to evaluate (FlexAttention's
    default, "cuda").

    The predicate is evaluated on every element (FlexAttention's create_mask, by query-row
    chunks), then each block is full (true everywhere), absent (false everywhere) or partial;
    the evaluated mask is the result's element mask when some block is partial. Evaluating only
    block corners would be cheaper but is wrong for predicates that are not monotone inside a
    block (document ids, dilation, prefix-LM with holes), so it is not done. Needs torch >= 2.5.
    """
    bq, bk = _pair(block_size)
    B, H = B or 1, H or 1
    elem = _evaluate_mask_mod(mask_mod, B, H, Q_LEN, KV_LEN, device, bq)
    full, partial = _block_states(elem, bq, bk)
    return _compressed(full, partial, (bq, bk), elem)


def block_mask_from_flex(block_mask, *, block_size=None) -> BlockMask:
    """A ``torch.nn.attention.flex_attention.BlockMask`` as flashattn's ``BlockMask``.

    Its kv lists are taken as they are (partial: kv_num_blocks/kv_indices, full:
    full_kv_num_blocks/full_kv_indices). When some block is partial and its mask_mod is not
    ``noop_mask``, the mask_mod is evaluated on every element (as block_mask_from_mask_mod
    does) into the element mask, over (B, H, Q_LEN, KV_LEN) from its ``seq_lengths`` when it
    has them (torch >= 2.6), else the blocks' extent. block_size: overrides its
    ``BLOCK_SIZE`` (torch 2.5's create_block_mask records (128, 128) whatever block size it
    used).
    """
    from torch.nn.attention.flex_attention import noop_mask

    bq, bk = _pair(block_size if block_size is not None else block_mask.BLOCK_SIZE)
    kv_num, kv_idx = block_mask.kv_num_blocks, block_mask.kv_indices
    if kv_idx.dim() != 4:
        raise ValueError(f"block_mask.kv_indices must have 4 dimensions (B, H, q_blocks, "
                         f"k_blocks), got shape {tuple(kv_idx.shape)}")
    mask = None
    if block_mask.mask_mod is not noop_mask and bool((kv_num > 0).any()):
        B, H, q_blocks = kv_num.shape
        lengths = getattr(block_mask, "seq_lengths", None)
        Q_LEN, KV_LEN = lengths if lengths is not None else (q_blocks * bq, kv_idx.shape[-1] * bk)
        mask = _evaluate_mask_mod(block_mask.mask_mod, B, H, Q_LEN, KV_LEN, kv_num.device, bq)
    return BlockMask(kv_num, kv_idx, block_mask.full_kv_num_blocks, block_mask.full_kv_indices,
                     (bq, bk), mask)
