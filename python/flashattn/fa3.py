"""FlashAttention-3's Python functions (the ``flash_attn_interface`` module of its Hopper build),
same names, argument order and return values, served by flashattn, so that code written for
FlashAttention-3 switches with one import:

    from flashattn.fa3 import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

or, for code that cannot be edited, ``flashattn.install_as_flash_attn_interface()`` before it
runs ``import flash_attn_interface``.

The argument order differs from flash_attn 2.x (``flashattn.flash_attn_func``): the fourth
positional argument is ``softmax_scale`` (there is no dropout), and ``return_attn_probs=True``
returns ``(out, softmax_lse)``. Each function calls the flash_attn 2.x function of this package
with the same options; autograd, torch.compile and every backend come with it.

Taken as in FlashAttention-3: causal, ``window_size``, ``softcap``, GQA/MQA, ``deterministic``,
``q_descale`` / ``k_descale`` / ``v_descale`` with float8_e4m3fn inputs (forward only),
``num_splits`` of ``flash_attn_with_kvcache`` without ``cu_seqlens_q`` (0 = the heuristic, 1 =
none; the other calls choose their own split and ignore it), paged caches (``page_table``, any
page size), ``cache_seqlens`` as an int or a tensor, and in ``flash_attn_with_kvcache`` a varlen
query (``cu_seqlens_q`` with ``max_seqlen_q``) against the cache without new keys: chunked prefill
and mixed prefill / decode batches, run as ``flash_attn_varlen_func`` with a block table (a dense
cache is seen as one page per sequence). ``pack_gqa``, ``sm_margin`` and ``scheduler_metadata``
are performance hints of FlashAttention-3's scheduler: accepted and ignored (flashattn chooses its
own schedule; ``get_scheduler_metadata`` returns None). ``flash_attn_with_kvcache(...,
return_softmax_lse=True)`` returns ``(out, softmax_lse)`` (FlashAttention-3 appends its split
buffers: ``out, lse, *rest = ...`` works with both).

Not taken (NotImplementedError naming the argument): ``qv``, ``attention_chunk`` > 0,
``seqused_q`` / ``seqused_k``, ``rotary_seqlens``, ``cu_seqlens_k_new``, and in a varlen
``flash_attn_with_kvcache`` call new ``k`` / ``v``, rotary tables, ``cache_leftpad`` or float8
queries (``q_descale``; float8 caches under bfloat16 / float16 queries are taken).
"""

from __future__ import annotations

from typing import Optional

from . import flash_attn_interface as _fa2
from ._packed import split_qkv_heads

__all__ = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
           "flash_attn_with_kvcache", "get_scheduler_metadata"]


def _refuse(**given) -> None:
    """NotImplementedError naming the first FlashAttention-3 argument flashattn lacks."""
    for name, value in given.items():
        if value is None or (name == "attention_chunk" and value == 0):
            continue
        why = {
            "qv": "the extra q.v term of FlashAttention-3's MLA path",
            "attention_chunk": "chunked (local block) attention",
            "seqused_q": "per-sequence used lengths inside cu_seqlens slots",
            "seqused_k": "per-sequence used lengths inside cu_seqlens slots",
            "rotary_seqlens": "rotary positions apart from cache_seqlens",
            "cu_seqlens_k_new": "varlen new keys appended to the cache",
        }.get(name, "this combination")
        raise NotImplementedError(f"flashattn.fa3: {name} ({why}) is not supported by flashattn; "
                                  f"pass {'0' if name == 'attention_chunk' else 'None'}")


def _window(window_size):
    left, right = window_size
    return (-1 if left is None else int(left), -1 if right is None else int(right))


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None,
                    k_descale=None, v_descale=None, window_size=(-1, -1), attention_chunk=0,
                    softcap=0.0, num_splits=1, pack_gqa=None, deterministic=False, sm_margin=0,
                    return_attn_probs=False):
    """FlashAttention-3's flash_attn_func: out, or (out, softmax_lse) with return_attn_probs."""
    _refuse(qv=qv, attention_chunk=attention_chunk)
    res = _fa2.flash_attn_func(q, k, v, 0.0, softmax_scale, causal, _window(window_size), softcap,
                               None, deterministic, return_attn_probs, q_descale=q_descale,
                               k_descale=k_descale, v_descale=v_descale)
    return res[:2] if return_attn_probs else res


def flash_attn_qkvpacked_func(qkv, softmax_scale=None, causal=False, q_descale=None,
                              k_descale=None, v_descale=None, window_size=(-1, -1),
                              attention_chunk=0, softcap=0.0, deterministic=False,
                              num_heads_q=None, sm_margin=0, return_attn_probs=False):
    """FlashAttention-3's flash_attn_qkvpacked_func: qkv (batch, seqlen, 3, nheads, headdim), or
    (batch, seqlen, nheads_q + 2 * nheads_k, headdim) with num_heads_q."""
    _refuse(attention_chunk=attention_chunk)
    opts = dict(q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    if qkv.dim() == 5:
        res = _fa2.flash_attn_qkvpacked_func(qkv, 0.0, softmax_scale, causal, _window(window_size),
                                             softcap, None, deterministic, return_attn_probs,
                                             **opts)
    else:
        q, k, v = split_qkv_heads(qkv, num_heads_q, "flashattn.fa3")
        res = _fa2.flash_attn_func(q, k, v, 0.0, softmax_scale, causal, _window(window_size),
                                   softcap, None, deterministic, return_attn_probs, **opts)
    return res[:2] if return_attn_probs else res


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           seqused_q=None, seqused_k=None, softmax_scale=None, causal=False,
                           qv=None, q_descale=None, k_descale=None, v_descale=None,
                           window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                           pack_gqa=None, deterministic=False, sm_margin=0,
                           return_attn_probs=False):
    """FlashAttention-3's flash_attn_varlen_func: out, or (out, softmax_lse)."""
    _refuse(qv=qv, attention_chunk=attention_chunk, seqused_q=seqused_q, seqused_k=seqused_k)
    res = _fa2.flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                      max_seqlen_k, 0.0, softmax_scale, causal,
                                      _window(window_size), softcap, None, deterministic,
                                      return_attn_probs, q_descale=q_descale,
                                      k_descale=k_descale, v_descale=v_descale)
    return res[:2] if return_attn_probs else res


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, page_table=None, cu_seqlens_q=None,
                            cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                            q_descale=None, k_descale=None, v_descale=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), attention_chunk=0, softcap=0.0,
                            rotary_interleaved=True, scheduler_metadata=None, num_splits=0,
                            pack_gqa=None, sm_margin=0, return_softmax_lse=False):
    """FlashAttention-3's flash_attn_with_kvcache: out, or (out, softmax_lse). Forward only."""
    _refuse(qv=qv, attention_chunk=attention_chunk, rotary_seqlens=rotary_seqlens,
            cu_seqlens_k_new=cu_seqlens_k_new)
    window = _window(window_size)
    if cu_seqlens_q is None:
        res = _fa2.flash_attn_with_kvcache(
            q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            cache_leftpad, page_table, softmax_scale, causal, window, softcap, rotary_interleaved,
            None, num_splits, return_softmax_lse, q_descale=q_descale, k_descale=k_descale,
            v_descale=v_descale)
        return res
    return _varlen_against_cache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                                 cache_batch_idx, cache_leftpad, page_table, cu_seqlens_q,
                                 max_seqlen_q, q_descale, k_descale, v_descale, softmax_scale,
                                 causal, window, softcap, num_splits, return_softmax_lse)


def _varlen_against_cache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                          cache_batch_idx, cache_leftpad, page_table, cu_seqlens_q, max_seqlen_q,
                          q_descale, k_descale, v_descale, softmax_scale, causal, window, softcap,
                          num_splits, return_softmax_lse):
    """A varlen query (total_q, nheads, headdim) against the cache, no new keys: sequence b has
    the rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) and the first cache_seqlens[b] cache rows
    as keys (bottom-right aligned masks). Run as flash_attn_varlen_func with a block table: the
    key counts' prefix sums are its cu_seqlens_k; a dense cache is one page per sequence."""
    import torch  # the kvcache path of FlashAttention-3 is torch-only as well

    for name, value in (("k", k), ("v", v), ("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin),
                        ("cache_leftpad", cache_leftpad), ("q_descale", q_descale)):
        if value is not None:
            why = ("float8 queries do not read a paged or varlen cache here (bfloat16 / float16 "
                   "queries over a float8 cache do)" if name == "q_descale" else
                   "a varlen query reads the cache without appending or rotating; append first, or "
                   "call without cu_seqlens_q")
            raise NotImplementedError(f"flashattn.fa3: {name} is not supported together with "
                                      f"cu_seqlens_q in flash_attn_with_kvcache: {why}")
    if max_seqlen_q is None:
        raise ValueError("flashattn.fa3: max_seqlen_q is required with cu_seqlens_q")
    batch = cu_seqlens_q.shape[0] - 1
    device = q.device
    if page_table is None:
        if k_cache.dim() != 4:
            raise ValueError(f"flashattn.fa3: k_cache must be (batch_cache, seqlen_cache, "
                             f"nheads_k, headdim), got shape {tuple(k_cache.shape)}")
        rows = (torch.arange(batch, dtype=torch.int32, device=device) if cache_batch_idx is None
                else cache_batch_idx.to(device=device, dtype=torch.int32))
        table = rows.reshape(batch, 1)  # page size = seqlen_cache: one page per sequence
        capacity = k_cache.shape[1]
    else:
        if cache_batch_idx is not None:
            raise ValueError("flashattn.fa3: cache_batch_idx cannot be combined with page_table")
        table = page_table
        capacity = page_table.shape[1] * k_cache.shape[1]
    if cache_seqlens is None:
        counts = torch.full((batch,), capacity, dtype=torch.int32, device=device)
    elif isinstance(cache_seqlens, int):
        counts = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=device)
    else:
        counts = cache_seqlens.to(dtype=torch.int32)
    cu_seqlens_k = torch.zeros(batch + 1, dtype=torch.int32, device=counts.device)
    torch.cumsum(counts, 0, out=cu_seqlens_k[1:])
    res = _fa2.flash_attn_varlen_func(q, k_cache, v_cache, cu_seqlens_q, cu_seqlens_k,
                                      int(max_seqlen_q), int(capacity), 0.0, softmax_scale,
                                      causal, window, softcap, None, False, return_softmax_lse,
                                      block_table=table, q_descale=q_descale,
                                      k_descale=k_descale, v_descale=v_descale)
    return res[:2] if return_softmax_lse else res


def get_scheduler_metadata(*args, **kwargs) -> Optional[object]:
    """FlashAttention-3 precomputes its scheduler's metadata here; flashattn needs none: None,
    which ``flash_attn_with_kvcache(scheduler_metadata=...)`` accepts."""
    return None
