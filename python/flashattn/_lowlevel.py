"""Low-level API for users of any DLPack framework (numpy, CuPy, PyTorch without autograd...):
``forward`` and ``backward`` write into outputs the caller preallocated.

Nothing here imports torch or CuPy; a tensor's framework is recognised by the module of its
type, and only then is that framework asked for its current CUDA stream.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

from . import _C

# FLASHATTN_CHECK_CU_SEQLENS=1 checks the varlen metadata of every call (see check_cu_seqlens
# in forward). Read once, here, at import: the check itself must not cost an environment lookup.
CHECK_CU_SEQLENS: bool = os.environ.get("FLASHATTN_CHECK_CU_SEQLENS", "0").strip().lower() not in (
    "", "0", "false", "no", "off")

_DLPACK_CUDA = 2
_U64 = (1 << 64) - 1  # seeds and offsets are 64-bit unsigned; negative ints wrap


def _framework(x: Any) -> str:
    return type(x).__module__.split(".", 1)[0]


def _is_cuda(x: Any) -> bool:
    dev = getattr(x, "__dlpack_device__", None)
    if dev is None:
        return False
    try:
        return int(dev()[0]) == _DLPACK_CUDA
    except Exception:  # noqa: BLE001 - an odd producer: let the extension report on it
        return False


def current_stream(x: Any) -> int:
    """The stream a CUDA array's framework is using now (0 = legacy default stream).

    torch: ``torch.cuda.current_stream(x.device).cuda_stream``; CuPy:
    ``cupy.cuda.get_current_stream().ptr``; any other framework: 0.
    """
    if not _is_cuda(x):
        return 0
    fw = _framework(x)
    if fw == "torch":
        import torch

        return torch.cuda.current_stream(x.device).cuda_stream
    if fw == "cupy" and "cupy" in sys.modules:
        return sys.modules["cupy"].cuda.get_current_stream().ptr
    return 0


def _plain(x: Any) -> Any:
    """torch tensors are detached: DLPack refuses tensors that require grad."""
    if x is not None and _framework(x) == "torch" and getattr(x, "requires_grad", False):
        return x.detach()
    return x


def is_float8(x: Any) -> bool:
    """Whether x holds float8_e4m3fn (torch.float8_e4m3fn, or numpy with ml_dtypes)."""
    return x is not None and str(getattr(x, "dtype", "")).endswith("float8_e4m3fn")


def float8_views(**arrays) -> tuple:
    """(arrays, names): each float8_e4m3fn array replaced by a uint8 view of the same memory
    (torch exports float8 by DLPack only from 2.8 on, numpy's ml_dtypes never), and the names
    of those the extension must read as float8_e4m3 (its ``float8`` argument), or None."""
    names = tuple(name for name, x in arrays.items() if is_float8(x))
    if not names:
        return arrays, None
    out = dict(arrays)
    for name in names:
        x = arrays[name]
        out[name] = x.view(_uint8_of(x))
    return out, names


def _uint8_of(x: Any):
    if _framework(x) == "torch":
        import torch

        return torch.uint8
    import numpy

    return numpy.uint8


class _DeviceGuard:
    """For torch CUDA tensors: make the tensor's GPU current (torch exports a CUDA tensor by
    DLPack only from its own device)."""

    def __init__(self, x: Any):
        self._guard = None
        if _is_cuda(x) and _framework(x) == "torch":
            import torch

            self._guard = torch.cuda.device(x.device)

    def __enter__(self):
        if self._guard is not None:
            self._guard.__enter__()

    def __exit__(self, *exc):
        if self._guard is not None:
            self._guard.__exit__(*exc)


_ERRORS = {"ValueError": ValueError, "TypeError": TypeError,
           "NotImplementedError": NotImplementedError, "RuntimeError": RuntimeError}


def raise_error(error) -> None:
    """Raises what an extension entry point returned: None, or (exception class name, message)."""
    if error is not None:
        kind, message = error
        raise _ERRORS.get(kind, RuntimeError)(message)


def check_rank(name: str, shape, varlen: bool) -> None:
    """The rank q must have before outputs can be shaped (the library checks the rest)."""
    rank = 3 if varlen else 4
    if len(shape) != rank:
        layout = "(total, heads, head_dim)" if varlen else "(batch, seqlen, heads, head_dim)"
        raise ValueError(f"{name} must have {rank} dimensions {layout}, got shape {tuple(shape)}")


# The library takes softmax_scale in float32, where 0 means 1/sqrt(head_dim): anything up to
# 2^-150 rounds to that 0.
_FLOAT32_UNDERFLOW = 2.0 ** -150


def resolve_scale(softmax_scale: Optional[float]) -> float:
    """None -> 0.0, which the library reads as 1/sqrt(head_dim)."""
    if softmax_scale is None:
        return 0.0
    scale = real("softmax_scale", softmax_scale)
    if not scale > 0.0:
        raise ValueError(f"softmax_scale must be > 0 (or None for 1/sqrt(head_dim)), got {scale}")
    if scale <= _FLOAT32_UNDERFLOW:
        raise ValueError(f"softmax_scale = {scale} rounds to 0 in float32, which would mean the "
                         "default 1/sqrt(head_dim); pass at least 2**-149")
    return scale


def real(name: str, value: Any) -> float:
    """float(value); TypeError naming the argument when it is not a real number (a string is
    not one, though float() parses it)."""
    try:
        if isinstance(value, (str, bytes)):
            raise TypeError
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a real number, got {value!r}") from None


_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


def int32(name: str, value: Any) -> int:
    """value as a Python int that fits the library's int32 fields; ValueError naming the
    argument otherwise (instead of the binding's TypeError)."""
    try:
        result = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if isinstance(value, float) and value != result:  # (int() would truncate it silently)
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if not _INT32_MIN <= result <= _INT32_MAX:
        raise ValueError(f"{name} must fit in int32, got {result}")
    return result


def resolve_window(window_size) -> tuple[int, int]:
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ValueError(
            f"window_size must be a pair (left, right) of ints (-1 = unbounded), "
            f"got {window_size!r}") from None
    return int32("window_size[0]", left), int32("window_size[1]", right)


def check_varlen_metadata(cu_seqlens_q, cu_seqlens_k, total_q, total_k, max_seqlen_q=0,
                          max_seqlen_k=0, stream=None) -> None:
    """Checks varlen metadata without running attention: ``cu_seqlens_q/k`` (int32
    (batch + 1), CPU or CUDA; CUDA values are read back synchronously) start at 0, never
    decrease, end within ``total_q``/``total_k`` rows, and hold no sequence longer than
    ``max_seqlen_q``/``max_seqlen_k`` (when > 0). Raises ValueError naming the problem."""
    if stream is None:
        stream = current_stream(cu_seqlens_q)
    with _DeviceGuard(cu_seqlens_q):
        raise_error(_C.check_varlen(_plain(cu_seqlens_q), _plain(cu_seqlens_k),
                                    int(total_q), int(total_k),
                                    int32("max_seqlen_q", max_seqlen_q or 0),
                                    int32("max_seqlen_k", max_seqlen_k or 0), int(stream)))


def check_paged_metadata(block_table, cu_seqlens_k, num_blocks, page_size, stream=None) -> None:
    """Checks a paged varlen call's table without running attention: every sequence's key count
    (``cu_seqlens_k[b + 1] - cu_seqlens_k[b]``) fits in its ``block_table`` row (int32 (batch,
    max_blocks): ``max_blocks * page_size`` keys) and the entries covering its keys are pages in
    ``[0, num_blocks)``. CPU or CUDA arrays (CUDA values are read back synchronously, on the
    current stream of the one on a GPU). Raises ValueError naming the problem (TypeError for a
    wrong dtype)."""
    ref = block_table if _is_cuda(block_table) else cu_seqlens_k
    if stream is None:
        stream = current_stream(ref)
    with _DeviceGuard(ref):
        raise_error(_C.check_paged(_plain(block_table), _plain(cu_seqlens_k), int(num_blocks),
                                   int(page_size), int(stream)))


def block_sizes(block_size, block_mask) -> tuple:
    """(block_size_q, block_size_k) from ``block_size`` (an int or a pair); (0, 0) without a
    block mask."""
    if block_mask is None:
        if block_size is not None:
            raise ValueError("block_size was given without block_mask")
        return 0, 0
    if block_size is None:
        raise ValueError("block_mask needs block_size=(block_size_q, block_size_k)")
    if isinstance(block_size, int):
        return int32("block_size", block_size), int32("block_size", block_size)
    try:
        bq, bk = block_size
    except (TypeError, ValueError):
        raise ValueError(f"block_size must be an int or a pair (block_size_q, block_size_k), got "
                         f"{block_size!r}") from None
    return int32("block_size[0]", bq), int32("block_size[1]", bk)


# The compressed block mask's arrays, named as the extension (and flashattn::BlockMaskLists)
# name them.
BLOCK_LISTS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")


def varlen_lengths(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) -> tuple:
    """(max_seqlen_q, max_seqlen_k), each 0 replaced by the longest sequence in cu_seqlens."""
    def longest(cu, given):
        if given or len(cu) < 2:
            return int(given or 0)
        return int((cu[1:] - cu[:-1]).max())

    return longest(cu_seqlens_q, max_seqlen_q), longest(cu_seqlens_k, max_seqlen_k)


def resolve_score_mods(attn_bias, attn_mask, block_mask, block_size, lengths) -> dict:
    """The bias and mask keywords as the extension (and the torch ops) take them: attn_bias,
    attn_mask, block_mask (the dense form or None), block_size_q, block_size_k and the four
    BLOCK_LISTS arrays (or None).

    block_mask is the dense (batch|1, heads|1, q_blocks, k_blocks) bool/uint8 array, which
    needs ``block_size``, or a ``flashattn.BlockMask`` (the compressed form), which brings its
    block size and element mask: its ``mask`` becomes attn_mask, cut to the call's lengths
    (``lengths()`` -> (seqlen_q, seqlen_k); varlen: the longest), so a separate attn_mask is
    refused (fold it into the BlockMask's mask)."""
    from .block_sparse import BlockMask

    # Plain item assignments only: torch.compile traces this (dict.update(**kw) breaks it).
    out = dict(attn_bias=attn_bias, attn_mask=attn_mask, block_mask=None)
    for name in BLOCK_LISTS:
        out[name] = None
    if isinstance(block_mask, BlockMask):
        bq, bk = block_sizes(block_mask.block_size, block_mask)
        if block_size is not None and block_sizes(block_size, block_mask) != (bq, bk):
            raise ValueError(f"block_size={block_size!r} differs from the BlockMask's block_size "
                             f"{tuple(block_mask.block_size)}; leave block_size out")
        if block_mask.kv_num_blocks is None and block_mask.full_kv_num_blocks is None:
            raise ValueError("the BlockMask has neither kv_num_blocks nor full_kv_num_blocks")
        mask = block_mask.mask
        if mask is not None:
            if attn_mask is not None:
                raise ValueError("attn_mask was given with a BlockMask that has its own element "
                                 "mask (BlockMask.mask); combine them into the BlockMask's mask")
            if len(mask.shape) < 2:
                raise ValueError(f"BlockMask.mask must have at least 2 dimensions (.., Q_LEN, "
                                 f"KV_LEN), got shape {tuple(mask.shape)}")
            seqlen_q, seqlen_k = lengths()
            rows, cols = mask.shape[-2], mask.shape[-1]
            if (rows != 1 and rows < seqlen_q) or cols < seqlen_k:
                raise ValueError(f"BlockMask.mask covers ({rows}, {cols}) query/key positions but "
                                 f"the call has ({seqlen_q}, {seqlen_k})")
            out["attn_mask"] = mask[..., :seqlen_q, :seqlen_k]
        for name in BLOCK_LISTS:
            out[name] = getattr(block_mask, name)
    elif type(block_mask).__name__ == "BlockMask" and hasattr(block_mask, "mask_mod"):
        raise TypeError("block_mask is a FlexAttention BlockMask; convert it once with "
                        "flashattn.block_mask_from_flex(block_mask) and pass the result")
    else:
        bq, bk = block_sizes(block_size, block_mask)
        out["block_mask"] = block_mask
    out["block_size_q"], out["block_size_k"] = bq, bk
    return out


def _score_mods(q, k, varlen, attn_bias, attn_mask, block_mask, block_size) -> dict:
    """The extension's keyword arguments for the additive bias and the masks; varlen =
    (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)."""
    def lengths():
        if varlen[0] is not None:
            return varlen_lengths(*varlen)
        return q.shape[1], k.shape[1]

    mods = resolve_score_mods(attn_bias, attn_mask, block_mask, block_size, lengths)
    return {name: value if name.startswith("block_size") else _plain(value)
            for name, value in mods.items()}


def _check_flag(check_cu_seqlens) -> bool:
    return CHECK_CU_SEQLENS if check_cu_seqlens is None else bool(check_cu_seqlens)


def forward(q, k, v, out, lse=None, *, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=0,
            max_seqlen_k=0, softmax_scale=None, causal=False, window_size=(-1, -1),
            softcap=0.0, alibi_slopes=None, dropout_p=0.0, seed=0, offset=0, num_splits=0,
            check_cu_seqlens=None, stream=None, num_threads=0, learnable_sink=None,
            attn_bias=None, attn_mask=None, block_mask=None, block_size=None, q_descale=None,
            k_descale=None, v_descale=None, block_table=None) -> None:
    """Attention forward into preallocated ``out`` (and ``lse`` unless None).

    Layouts (strides arbitrary, last dimension contiguous):
      q (batch, seqlen_q, heads, head_dim), k (batch, seqlen_k, heads_k, head_dim),
      v (batch, seqlen_k, heads_k, head_dim_v), out like q with head_dim_v,
      lse float32 (batch, heads, seqlen_q). Varlen (cu_seqlens_q/k int32 (batch + 1) given):
      (total, heads, head_dim) and lse (heads, total_q).
    ``dropout_p`` > 0 draws the keep mask from Philox keyed by (``seed``, ``offset``); pass
    the same values to ``backward``. ``stream``: CUDA stream handle as an int; None = the
    array framework's current stream (torch, CuPy), else the legacy default stream.
    ``num_threads``: CPU worker threads, 0 = all. ``check_cu_seqlens``: also check the varlen
    metadata of CUDA tensors (start 0, non-decreasing, within the rows, max_seqlen_* at least
    every length) by reading it back synchronously; None = the FLASHATTN_CHECK_CU_SEQLENS
    environment variable (read at import). CPU tensors are always checked.
    ``learnable_sink``: float32 (heads) sink logits joining each row's softmax denominator
    with no value row (the LSE includes them).
    ``attn_bias``: additive bias, float32 or q's dtype, broadcastable to (batch, heads,
    seqlen_q, seqlen_k) (leading dimensions full or 1, last one seqlen_k and contiguous).
    ``attn_mask``: bool/uint8 mask broadcast the same way, True = keep. ``block_mask``:
    bool/uint8 (batch|1, heads|1, ceil(seqlen_q / bq), ceil(seqlen_k / bk)) with
    ``block_size=(bq, bk)``, or a ``flashattn.BlockMask`` (the compressed form, which brings
    its block size and element mask); absent blocks are skipped. Varlen: over (max_seqlen_q,
    max_seqlen_k), positions inside each sequence. The CPU backend only for now
    (docs/SEMANTICS.md).
    FP8: q, k, v in float8_e4m3fn (torch.float8_e4m3fn, or numpy with ml_dtypes) write a
    bfloat16 ``out``; ``q_descale``, ``k_descale``, ``v_descale`` are optional float32
    (batch, heads_k) factors (any strides), FlashAttention-3's; docs/SEMANTICS.md, "FP8".
    ``block_table``: int32 (batch, max_blocks), with cu_seqlens: k and v are pages (num_blocks,
    page_size, heads_k, head_dim[_v]) and sequence b's keys are the first cu_seqlens_k[b + 1] -
    cu_seqlens_k[b] positions of its pages (flash_attn_varlen_func's paged KV; forward only, no
    dropout or masks; docs/SEMANTICS.md, "Paged K/V in a varlen call").
    Returns None; raises ValueError, TypeError, NotImplementedError or RuntimeError (see
    flashattn's package docs).
    """
    window_left, window_right = resolve_window(window_size)
    if stream is None:
        stream = current_stream(q)
    qkv, float8 = float8_views(q=q, k=k, v=v)
    q, k, v = qkv["q"], qkv["k"], qkv["v"]
    with _DeviceGuard(q):
        raise_error(_C.forward(_plain(q), _plain(k), _plain(v), _plain(out), _plain(lse),
                   cu_seqlens_q=_plain(cu_seqlens_q), cu_seqlens_k=_plain(cu_seqlens_k),
                   alibi_slopes=_plain(alibi_slopes),
                   max_seqlen_q=int32("max_seqlen_q", max_seqlen_q),
                   max_seqlen_k=int32("max_seqlen_k", max_seqlen_k),
                   softmax_scale=resolve_scale(softmax_scale),
                   causal=bool(causal), window_left=window_left, window_right=window_right,
                   softcap=real("softcap", softcap), dropout_p=real("dropout_p", dropout_p),
                   seed=int(seed) & _U64, offset=int(offset) & _U64,
                   num_splits=int32("num_splits", num_splits),
                   check_cu_seqlens=_check_flag(check_cu_seqlens), stream=int(stream),
                   num_threads=int32("num_threads", num_threads),
                   learnable_sink=_plain(learnable_sink), q_descale=_plain(q_descale),
                   k_descale=_plain(k_descale), v_descale=_plain(v_descale), float8=float8,
                   block_table=_plain(block_table),
                   **_score_mods(q, k, (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
                                 attn_bias, attn_mask, block_mask, block_size)))


def backward(dout, q, k, v, out, lse, dq, dk, dv, *, cu_seqlens_q=None, cu_seqlens_k=None,
             max_seqlen_q=0, max_seqlen_k=0, softmax_scale=None, causal=False,
             window_size=(-1, -1), softcap=0.0, alibi_slopes=None, dropout_p=0.0, seed=0,
             offset=0, deterministic=False, check_cu_seqlens=None, stream=None,
             num_threads=0, learnable_sink=None, dsink=None, attn_bias=None, attn_mask=None,
             block_mask=None, block_size=None, dbias=None) -> None:
    """Attention backward into preallocated ``dq``, ``dk``, ``dv`` (like q, k, v).

    ``out`` and ``lse`` are the forward's outputs; every option must match the forward call
    (same ``seed``/``offset`` with dropout). dk/dv are summed over the query heads of each GQA
    group. ``deterministic``: bitwise reproducible run to run. ``dsink``: optional float32
    (heads) output, the gradient of ``learnable_sink`` (which must then be given). ``dbias``:
    optional output shaped like ``attn_bias``, its gradient (summed over broadcast dimensions),
    float32 or the bias's own 16-bit dtype. Other arguments as in ``forward``.
    """
    window_left, window_right = resolve_window(window_size)
    if stream is None:
        stream = current_stream(q)
    with _DeviceGuard(q):
        raise_error(_C.backward(_plain(dout), _plain(q), _plain(k), _plain(v), _plain(out), _plain(lse),
                    _plain(dq), _plain(dk), _plain(dv), cu_seqlens_q=_plain(cu_seqlens_q),
                    cu_seqlens_k=_plain(cu_seqlens_k), alibi_slopes=_plain(alibi_slopes),
                    max_seqlen_q=int32("max_seqlen_q", max_seqlen_q),
                    max_seqlen_k=int32("max_seqlen_k", max_seqlen_k),
                    softmax_scale=resolve_scale(softmax_scale), causal=bool(causal),
                    window_left=window_left, window_right=window_right,
                    softcap=real("softcap", softcap), dropout_p=real("dropout_p", dropout_p),
                    seed=int(seed) & _U64, offset=int(offset) & _U64,
                    deterministic=bool(deterministic),
                    check_cu_seqlens=_check_flag(check_cu_seqlens), stream=int(stream),
                    num_threads=int32("num_threads", num_threads),
                    learnable_sink=_plain(learnable_sink), dsink=_plain(dsink),
                    dbias=_plain(dbias),
                    **_score_mods(q, k, (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
                                  attn_bias, attn_mask, block_mask, block_size)))


def forward_kvcache(q, k_cache, v_cache, out, lse=None, *, k=None, v=None, rotary_cos=None,
                    rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                    cache_leftpad=None, block_table=None, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, rotary_interleaved=True,
                    alibi_slopes=None, num_splits=0, stream=None, num_threads=0,
                    learnable_sink=None, q_descale=None, k_descale=None, v_descale=None) -> None:
    """Attention against a KV cache into preallocated ``out`` (and ``lse`` unless None).

    When ``k``/``v`` (batch, seqlen_new, heads_k, head_dim) are given they are first written into
    ``k_cache``/``v_cache`` in place at rows ``cache_seqlens[b]...`` (rotated by
    ``rotary_cos``/``rotary_sin`` when given). Caches are (batch_cache, seqlen_cache, heads_k,
    head_dim), or pages (num_blocks, page_size, heads_k, head_dim) with ``block_table`` int32
    (batch, max_blocks). ``cache_seqlens``, ``cache_batch_idx``, ``cache_leftpad``: int32
    (batch,) arrays. ``learnable_sink``: float32 (heads) sink logits, as in ``forward`` (the
    LSE includes them). FP8 KV cache: ``k_cache``/``v_cache`` in float8_e4m3fn with
    ``k_descale``/``v_descale`` float32 (batch, heads_k) (docs/SEMANTICS.md, "FP8 KV cache").
    Other arguments as in ``forward``; see flash_attn_with_kvcache.
    """
    window_left, window_right = resolve_window(window_size)
    if stream is None:
        stream = current_stream(q)
    arrays, float8 = float8_views(q=q, k_cache=k_cache, v_cache=v_cache, k=k, v=v)
    q, k_cache, v_cache, k, v = (arrays[n] for n in ("q", "k_cache", "v_cache", "k", "v"))
    with _DeviceGuard(q):
        raise_error(_C.forward_kvcache(
            _plain(q), k_cache, v_cache, _plain(k), _plain(v), _plain(rotary_cos),
            _plain(rotary_sin), cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
            _plain(alibi_slopes), _plain(out), _plain(lse), resolve_scale(softmax_scale),
            bool(causal), window_left, window_right, real("softcap", softcap),
            bool(rotary_interleaved), int32("num_splits", num_splits), int(stream),
            int32("num_threads", num_threads),
            _plain(learnable_sink), _plain(q_descale), _plain(k_descale), _plain(v_descale),
            float8))
