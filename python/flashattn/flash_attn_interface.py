"""The flash_attn 2.x functions, same names and arguments, so that model code can switch with
``import flashattn as flash_attn`` (or ``from flashattn.flash_attn_interface import ...``).

torch tensors go through the ``flashattn::*`` custom ops (autograd, torch.compile). Any other
array (numpy on the CPU, CuPy, ...) runs the forward pass only: outputs are allocated with the
array's own namespace (``__array_namespace__``, else numpy) and there is no autograd.

Differences from flash_attn, all deliberate:
* ``return_attn_probs=True`` returns ``(out, softmax_lse, None)``: the attention matrix is never
  materialised (flash_attn returns it, with dropout encoded in the sign, for its tests only).
* Dropout seeds: torch calls draw a fresh 64-bit seed per call from torch's default CPU
  generator (``torch.manual_seed`` makes runs reproducible); the backward reuses it, so it sees
  the same mask. Non-torch arrays draw the seed from numpy's global generator
  (``numpy.random.seed``). Use ``flashattn.forward``/``backward`` to pass a seed yourself.
* ``causal=True`` with a window: as in flash_attn, causal clamps the right side to 0, so
  ``window_size=(w, w)`` acts as ``(w, 0)`` (HF transformers calls it that way).
* The varlen functions take an extra keyword, ``check_cu_seqlens=False``: True reads the
  metadata back (a device synchronisation on CUDA) and checks it; the environment variable
  ``FLASHATTN_CHECK_CU_SEQLENS=1`` (read at import) checks every call. ``cu_seqlens`` given as
  CPU tensors for CUDA inputs are checked on the host for free and copied to the device
  (flash_attn requires them on the device).
* ``softmax_scale`` must be None or > 0.
* ``flash_attn_varlen_func``'s ``block_table`` (paged KV: k and v are pages (num_blocks,
  page_size, nheads_k, headdim) and sequence b's keys the first cu_seqlens_k[b + 1] -
  cu_seqlens_k[b] positions of its pages) takes any page size (flash_attn 2.x needs a multiple
  of 256), also float8_e4m3fn pages under bfloat16/float16 q with ``k_descale``/``v_descale``.
  Forward only, as in flash_attn (autograd raises NotImplementedError in the backward; under
  torch.compile with an autograd backend the error comes at compile time when an input
  requires grad, so compile such calls under torch.no_grad / inference_mode); no dropout, bias
  or masks with it. ``flash_attn_with_kvcache`` takes paged caches of any page
  size too, and rejects ``cache_batch_idx`` together with ``block_table``.
* ``flash_attn_with_kvcache`` with an int ``cache_seqlens`` makes a (batch,) tensor (flash_attn
  makes one of k_cache.shape[0] entries, which is wrong for paged caches).

Addition (FlashAttention-4's keyword): every function takes ``learnable_sink``, float32 (or,
with torch, any float dtype, cast to float32) of shape (nheads,): one logit per query head that
joins each row's softmax denominator with no value row (not scaled by softmax_scale, not
softcapped, never dropped); softmax_lse includes it, and autograd returns its gradient
(``flash_attn_with_kvcache`` has no backward).

Addition (issue 18): every function but ``flash_attn_with_kvcache`` takes keyword-only
``attn_bias`` (float32 or q's dtype, broadcastable to (batch, nheads, seqlen_q, seqlen_k); its
gradient flows when it requires grad), ``attn_mask`` (bool, broadcast the same way, True =
keep) and ``block_mask`` with ``block_size=(bq, bk)``: a dense bool (batch|1, nheads|1,
ceil(seqlen_q / bq), ceil(seqlen_k / bk)), or a ``flashattn.BlockMask`` (the compressed form:
per query block the partial and full key blocks, FlexAttention's layout; it brings its block
size and element mask; build one with ``flashattn.block_mask_from_dense``,
``block_mask_from_mask_mod`` or ``block_mask_from_flex``). Absent blocks are skipped. The
varlen functions take them over (max_seqlen_q, max_seqlen_k), indexed by positions inside each
sequence. On CUDA, forward and backward run on the sm80 kernels on every GPU, and on Hopper on the
sm90 kernels where those take the call (a bias gradient with softcap: sm80; docs/SEMANTICS.md).

Addition (issue 21, FlashAttention-3's keywords): every function takes keyword-only
``q_descale``, ``k_descale``, ``v_descale`` for float8_e4m3fn inputs (torch tensors): float32
factors of shape (batch, nheads_k), or anything that broadcasts to it (a 0-d or (1,) tensor is a
per-tensor factor; expanded, never copied). out is bfloat16. Forward only: autograd raises
NotImplementedError. ``flash_attn_with_kvcache`` takes float8_e4m3fn caches with bfloat16 or
float16 q (k/v appended in q's dtype are quantized into the cache as e4m3(x / descale)), or
everything in float8_e4m3fn. numpy float8 (ml_dtypes) is not taken by these functions: numpy has
no bfloat16 to write the output in; ``flashattn.forward`` takes it with a caller-made output.
See docs/SEMANTICS.md, "FP8".
"""

from __future__ import annotations

import sys
from typing import Any

import numpy

from . import _lowlevel

_real = _lowlevel.real  # float() naming the argument

try:  # torch is optional
    import torch
except ImportError:  # pragma: no cover - exercised where torch is absent
    torch = None
    _torch_ops = None
    _C = None  # the torch fast path's entry points are used only with torch
else:
    from . import _C, _torch_ops

    _is_compiling = torch.compiler.is_compiling

__all__ = [
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_with_kvcache",
]


def _is_torch(x: Any) -> bool:
    return torch is not None and isinstance(x, torch.Tensor)


def _finish(out, lse, return_attn_probs: bool):
    return (out, lse, None) if return_attn_probs else out


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    """flash_attn's key-block width, which its tests need to decode the attention matrix that
    its ``return_attn_probs=True`` returns. flashattn never materialises that matrix (the third
    result is None), so there is nothing to decode. Defined so that code importing the name
    (flash_attn's tests, through flashattn.install_as_flash_attn) imports; calling it raises."""
    raise NotImplementedError(
        "flashattn does not return the attention matrix (return_attn_probs=True gives None in "
        "its place), so flash_attn's block layout of that matrix (_get_block_size_n) does not "
        "apply")


def _torch_sink(learnable_sink):
    """learnable_sink as the library takes it: float32 and contiguous. The cast is part of the
    autograd graph, so a bfloat16 parameter gets its gradient in bfloat16."""
    if learnable_sink is None or not _is_torch(learnable_sink):
        return learnable_sink
    return learnable_sink.to(torch.float32).contiguous()


def _score_mods(attn_bias, attn_mask, block_mask, block_size) -> dict:
    """The bias and mask keywords as a dict (resolved per call path with the lengths)."""
    return dict(attn_bias=attn_bias, attn_mask=attn_mask, block_mask=block_mask,
                block_size=block_size)


def _torch_mods(mods: dict, lengths) -> tuple:
    """The trailing torch op options (_torch_ops.SCORE_MOD_OPTIONS: attn_bias, attn_mask,
    block_mask, block sizes, the compressed block mask's tensors); empty when none is given, so
    the ops' defaults apply. lengths() -> (seqlen_q, seqlen_k) of the call (varlen: the
    longest), read only for a BlockMask's element mask."""
    if (mods["attn_bias"] is None and mods["attn_mask"] is None and mods["block_mask"] is None
            and mods["block_size"] is None):
        return ()
    resolved = _lowlevel.resolve_score_mods(**mods, lengths=lengths)
    return tuple(resolved[name] for name in _torch_ops.SCORE_MOD_OPTIONS)


def _dim(x, i: int) -> int:
    """x.shape[i], or -1 where x has no such dimension (then the library names x's rank)."""
    shape = getattr(x, "shape", ())
    return shape[i] if -len(shape) <= i < len(shape) else -1


def _descales(q_descale, k_descale, v_descale, batch: int, heads_k: int) -> tuple:
    """The descale factors as the ops take them: torch tensors broadcast (a view, no copy) to
    (batch, heads_k); None stays None. ValueError naming the argument when one does not
    broadcast. batch or heads_k -1 (_dim: an operand of the wrong rank): left as given, for
    the library to name the operand."""
    out = []
    for name, d in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if (d is not None and _is_torch(d) and batch >= 0 and heads_k >= 0
                and tuple(d.shape) != (batch, heads_k)):
            try:
                d = torch.broadcast_to(d, (batch, heads_k))
            except RuntimeError:
                raise ValueError(f"{name} must have shape (batch, heads_k) = ({batch}, {heads_k}) "
                                 f"or broadcast to it, got {tuple(d.shape)}") from None
        out.append(d)
    return tuple(out)


def _torch_tail(mods: dict, lengths, descales: tuple) -> tuple:
    """The trailing torch op options: the score mods (_torch_mods), then the descales when any
    is given (with the score mods' defaults before them)."""
    tail = _torch_mods(mods, lengths)
    if all(d is None for d in descales):
        return tail
    if not tail:
        tail = tuple(0 if n.startswith("block_size") else None
                     for n in _torch_ops.SCORE_MOD_OPTIONS)
    return tail + descales


def _no_float8_arrays(q) -> None:
    if _lowlevel.is_float8(q):
        raise TypeError("float8_e4m3fn q: the flash_attn functions take FP8 inputs as torch "
                        "tensors (numpy has no bfloat16 for the output); use flashattn.forward "
                        "with a preallocated bfloat16 output")


# ---- non-torch arrays -------------------------------------------------------------------------

def _shape(name: str, x: Any) -> tuple:
    shape = getattr(x, "shape", None)
    if shape is None:
        raise TypeError(f"{name} must be an array (numpy.ndarray, torch.Tensor, ...), "
                        f"got {type(x).__qualname__}")
    return tuple(shape)


def _empty(like: Any, shape: tuple, dtype: Any = None) -> Any:
    """An uninitialised array in like's namespace and on like's device."""
    if hasattr(like, "__array_namespace__"):
        ns = like.__array_namespace__()
        kwargs = {"device": like.device} if hasattr(like, "device") else {}
    else:
        # No array API (e.g. older CuPy): use the array's own module, whose empty() allocates on
        # the current device, which is where a CUDA array's framework works; numpy otherwise.
        ns = sys.modules.get(type(like).__module__.split(".", 1)[0], numpy)
        if not hasattr(ns, "empty"):
            ns = numpy
        kwargs = {}
    return ns.empty(shape, dtype=like.dtype if dtype is None else getattr(ns, dtype), **kwargs)


def _select(packed: Any, index: int, n: int, name: str) -> Any:
    shape = _shape(name, packed)
    if len(shape) < 3 or shape[-3] != n:
        raise ValueError(f"{name} must have shape (..., {n}, heads, head_dim), got {shape}")
    return packed[(Ellipsis, index, slice(None), slice(None))]


def _array_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                     return_attn_probs, learnable_sink=None, check_cu_seqlens=False,
                     score_mods=None, descales=(None, None, None)):
    varlen = cu_seqlens_q is not None
    q_shape, v_shape = _shape("q", q), _shape("v", v)
    _lowlevel.check_rank("q", q_shape, varlen)
    out = _empty(q, q_shape[:-1] + v_shape[-1:])
    lse_shape = (q_shape[1], q_shape[0]) if varlen else (q_shape[0], q_shape[2], q_shape[1])
    lse = _empty(q, lse_shape, "float32")
    dropout_p = _real("dropout_p", dropout_p)
    seed = int(numpy.random.randint(0, 2**64, dtype=numpy.uint64)) if dropout_p > 0 else 0
    _lowlevel.forward(q, k, v, out, lse, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                      max_seqlen_q=max_seqlen_q or 0, max_seqlen_k=max_seqlen_k or 0,
                      softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                      softcap=softcap, alibi_slopes=alibi_slopes, dropout_p=dropout_p,
                      seed=seed, learnable_sink=learnable_sink,
                      check_cu_seqlens=True if check_cu_seqlens else None,
                      q_descale=descales[0], k_descale=descales[1], v_descale=descales[2],
                      **(score_mods or {}))
    return _finish(out, lse, return_attn_probs)


# ---- public functions -------------------------------------------------------------------------

def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, learnable_sink=None, *, attn_bias=None,
                    attn_mask=None, block_mask=None, block_size=None,
                    q_descale=None, k_descale=None, v_descale=None):
    """Exact attention softmax(q k^T * scale) v.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim), nheads a
    multiple of nheads_k (MQA/GQA). Last dimension contiguous, other strides arbitrary.
    dropout_p: dropout probability on P (pass 0.0 in eval). softmax_scale: default
    1/sqrt(headdim). causal: bottom-right aligned causal mask. window_size (left, right):
    sliding window, -1 = unbounded. softcap: > 0 applies softcap * tanh(s / softcap).
    alibi_slopes: float32 (nheads,) or (batch, nheads). deterministic: reproducible backward.
    return_attn_probs: also return softmax_lse (batch, nheads, seqlen_q) float32 and None.
    learnable_sink: (nheads,) sink logits (FlashAttention-4's keyword; see the module docs).
    attn_bias, attn_mask, block_mask, block_size: additive bias, boolean mask and block-sparse
    mask, dense or a flashattn.BlockMask (see the module docs; CPU only for now).

    Returns out (batch, seqlen_q, nheads, headdim_v), or (out, softmax_lse, None).
    """
    if (attn_bias is None and attn_mask is None and block_mask is None and block_size is None
            and q_descale is None and k_descale is None and v_descale is None
            and _C is not None and not _is_compiling()):
        # Eager calls on plain torch tensors, all of it in the extension (a training call:
        # through _torch_ops.FuncAutograd); None: any other call, which takes the path below
        # (see _torch_ops, "Fast path").
        result = _C.torch_forward(q, k, v, None, None, 0, 0, alibi_slopes, softmax_scale, causal,
                                  window_size, softcap, dropout_p, 0, learnable_sink, False, True)
        if result is True:  # taken, but it records an autograd graph: the training call
            if not return_attn_probs:
                return _torch_ops.func_autograd(q, k, v, alibi_slopes, softmax_scale, causal,
                                                window_size, softcap, dropout_p, deterministic,
                                                learnable_sink, False)
            out, lse = _torch_ops.func_autograd(q, k, v, alibi_slopes, softmax_scale, causal,
                                                window_size, softcap, dropout_p, deterministic,
                                                learnable_sink, True)
            return out, lse, None
        if result is not None:
            _torch_ops.last_route["forward"] = "fast"
            out, lse = _torch_ops.fast_result(result)
            return (out, lse, None) if return_attn_probs else out
    mods = _score_mods(attn_bias, attn_mask, block_mask, block_size)
    if not _is_torch(q):
        _no_float8_arrays(q)
        return _array_attention(q, k, v, None, None, 0, 0, dropout_p, softmax_scale, causal,
                                window_size, softcap, alibi_slopes, return_attn_probs,
                                learnable_sink, score_mods=mods,
                                descales=(q_descale, k_descale, v_descale))
    wl, wr = _lowlevel.resolve_window(window_size)
    descales = _descales(q_descale, k_descale, v_descale, _dim(q, 0), _dim(k, 2))
    out, lse = _torch_ops.call_forward(
        _torch_ops.fwd,
        q, k, v, None, None, 0, 0, alibi_slopes, _lowlevel.resolve_scale(softmax_scale),
        bool(causal), wl, wr, _real("softcap", softcap), _real("dropout_p", dropout_p),
        _torch_ops.draw_rng_state(dropout_p), bool(deterministic), _torch_sink(learnable_sink),
        *_torch_tail(mods, lambda: (q.shape[1], k.shape[1]), descales))
    return _finish(out, lse, return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False, learnable_sink=None,
                              *, attn_bias=None, attn_mask=None, block_mask=None,
                              block_size=None, q_descale=None, k_descale=None,
                              v_descale=None):
    """flash_attn_func on packed qkv (batch, seqlen, 3, nheads, headdim); q, k and v are
    strided views of qkv (no copy) and the gradient is written into one dqkv tensor."""
    mods = _score_mods(attn_bias, attn_mask, block_mask, block_size)
    if not _is_torch(qkv):
        _no_float8_arrays(qkv)
        q, k, v = (_select(qkv, i, 3, "qkv") for i in range(3))
        return _array_attention(q, k, v, None, None, 0, 0, dropout_p, softmax_scale, causal,
                                window_size, softcap, alibi_slopes, return_attn_probs,
                                learnable_sink, score_mods=mods,
                                descales=(q_descale, k_descale, v_descale))
    wl, wr = _lowlevel.resolve_window(window_size)
    descales = _descales(q_descale, k_descale, v_descale, _dim(qkv, 0), _dim(qkv, -2))
    out, lse = _torch_ops.call_forward(
        _torch_ops.fwd_qkvpacked,
        qkv, None, 0, alibi_slopes, _lowlevel.resolve_scale(softmax_scale), bool(causal), wl,
        wr, _real("softcap", softcap), _real("dropout_p", dropout_p),
        _torch_ops.draw_rng_state(dropout_p), bool(deterministic), _torch_sink(learnable_sink),
        *_torch_tail(mods, lambda: (qkv.shape[1], qkv.shape[1]), descales))
    return _finish(out, lse, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False, learnable_sink=None,
                             *, attn_bias=None, attn_mask=None, block_mask=None,
                             block_size=None, q_descale=None, k_descale=None,
                             v_descale=None):
    """flash_attn_func with packed kv (batch, seqlen_k, 2, nheads_k, headdim)."""
    mods = _score_mods(attn_bias, attn_mask, block_mask, block_size)
    if not _is_torch(q):
        _no_float8_arrays(q)
        k, v = (_select(kv, i, 2, "kv") for i in range(2))
        return _array_attention(q, k, v, None, None, 0, 0, dropout_p, softmax_scale, causal,
                                window_size, softcap, alibi_slopes, return_attn_probs,
                                learnable_sink, score_mods=mods,
                                descales=(q_descale, k_descale, v_descale))
    wl, wr = _lowlevel.resolve_window(window_size)
    descales = _descales(q_descale, k_descale, v_descale, _dim(q, 0), _dim(kv, -2))
    out, lse = _torch_ops.call_forward(
        _torch_ops.fwd_kvpacked,
        q, kv, None, None, 0, 0, alibi_slopes, _lowlevel.resolve_scale(softmax_scale),
        bool(causal), wl, wr, _real("softcap", softcap), _real("dropout_p", dropout_p),
        _torch_ops.draw_rng_state(dropout_p), bool(deterministic), _torch_sink(learnable_sink),
        *_torch_tail(mods, lambda: (q.shape[1], kv.shape[1]), descales))
    return _finish(out, lse, return_attn_probs)


def _paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                  softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs,
                  block_table, learnable_sink, check_cu_seqlens, mods, descales):
    """flash_attn_varlen_func with block_table: k and v are pages (forward only)."""
    if (_real("dropout_p", dropout_p) > 0.0
            or any(x is not None and not isinstance(x, int) for x in mods.values())):
        raise NotImplementedError("block_table (paged K/V) takes no dropout_p, attn_bias, "
                                  "attn_mask or block_mask: it is an inference path")
    if descales[0] is not None:
        raise NotImplementedError("q_descale with block_table: paged K/V takes bfloat16/float16 q "
                                  "(the pages may be float8_e4m3fn, with k_descale/v_descale)")
    wl, wr = _lowlevel.resolve_window(window_size)
    if not _is_torch(q):
        q_shape, v_shape = _shape("q", q), _shape("v", v)
        _lowlevel.check_rank("q", q_shape, True)
        out = _empty(q, q_shape[:-1] + v_shape[-1:])
        lse = _empty(q, (q_shape[1], q_shape[0]), "float32")
        _lowlevel.forward(q, k, v, out, lse, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                          max_seqlen_q=max_seqlen_q or 0, max_seqlen_k=max_seqlen_k or 0,
                          softmax_scale=softmax_scale, causal=causal, window_size=window_size,
                          softcap=softcap, alibi_slopes=alibi_slopes,
                          learnable_sink=learnable_sink,
                          check_cu_seqlens=True if check_cu_seqlens else None,
                          k_descale=descales[1], v_descale=descales[2], block_table=block_table)
        return _finish(out, lse, return_attn_probs)
    # The table's values are checked where that is free (the table and cu_seqlens_k in host
    # memory for CUDA tensors) or was asked for (check_cu_seqlens: a device read), as the varlen
    # metadata is; the library checks CPU tensors itself.
    host_values = (q.is_cuda and block_table.device.type == "cpu"
                   and cu_seqlens_k.device.type == "cpu")
    if ((host_values or (check_cu_seqlens and q.is_cuda)) and k.dim() == 4
            and not torch.compiler.is_compiling()):  # (other ranks: the library names k's)
        _lowlevel.check_paged_metadata(block_table, cu_seqlens_k, k.shape[0], k.shape[1])
    # The key counts are not rows of k (a page may serve several sequences): no bound on them.
    cu_seqlens_q, cu_seqlens_k = _torch_ops.varlen_metadata(
        q.device, _dim(q, 0), 2**31 - 1, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        check_cu_seqlens)
    if q.is_cuda and block_table.device != q.device:
        block_table = block_table.to(q.device, non_blocking=True)
    k_descale, v_descale = _descales(None, descales[1], descales[2], _dim(cu_seqlens_q, 0) - 1,
                                     _dim(k, -2))[1:]
    out, lse = _torch_ops.call_forward(
        _torch_ops.fwd_paged, q, k, v, block_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
        max_seqlen_k, alibi_slopes, _lowlevel.resolve_scale(softmax_scale), bool(causal), wl, wr,
        _real("softcap", softcap), 0, _torch_sink(learnable_sink), k_descale, v_descale)
    return _finish(out, lse, return_attn_probs)


def _varlen_lengths(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
    return lambda: _lowlevel.varlen_lengths(cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                            max_seqlen_k)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False,
                           window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None,
                           learnable_sink=None, *, check_cu_seqlens=False, attn_bias=None,
                           attn_mask=None, block_mask=None, block_size=None,
                    q_descale=None, k_descale=None, v_descale=None):
    """Variable-length batch: q (total_q, nheads, headdim), k, v (total_k, nheads_k, headdim),
    cu_seqlens_q/k int32 (batch + 1) prefix sums, max_seqlen_q/k the longest sequences.
    softmax_lse is (nheads, total_q). block_table int32 (batch, max_blocks): paged KV, k and v
    (num_blocks, page_size, nheads_k, headdim), forward only (see the module docs).
    check_cu_seqlens: check the metadata (see the module docs). attn_bias, attn_mask,
    block_mask, block_size: as in flash_attn_func, laid out over (max_seqlen_q, max_seqlen_k)
    and indexed by positions inside each sequence (see the module docs)."""
    mods = _score_mods(attn_bias, attn_mask, block_mask, block_size)
    if block_table is not None:
        return _paged_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                             dropout_p, softmax_scale, causal, window_size, softcap,
                             alibi_slopes, return_attn_probs, block_table, learnable_sink,
                             check_cu_seqlens, mods, (q_descale, k_descale, v_descale))
    if not _is_torch(q):
        return _array_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                                softcap, alibi_slopes, return_attn_probs,
                                learnable_sink, check_cu_seqlens, mods,
                                (q_descale, k_descale, v_descale))
    cu_seqlens_q, cu_seqlens_k = _torch_ops.varlen_metadata(
        q.device, _dim(q, 0), _dim(k, 0), cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
        max_seqlen_k, check_cu_seqlens)
    wl, wr = _lowlevel.resolve_window(window_size)
    out, lse = _torch_ops.call_forward(
        _torch_ops.fwd,
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
        _lowlevel.resolve_scale(softmax_scale), bool(causal), wl, wr, _real("softcap", softcap),
        _real("dropout_p", dropout_p), _torch_ops.draw_rng_state(dropout_p), bool(deterministic),
        _torch_sink(learnable_sink),
        *_torch_tail(mods, _varlen_lengths(cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                           max_seqlen_k),
                     _descales(q_descale, k_descale, v_descale, _dim(cu_seqlens_q, 0) - 1,
                               _dim(k, -2))))
    return _finish(out, lse, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, learnable_sink=None, *,
                                     check_cu_seqlens=False, attn_bias=None, attn_mask=None,
                                     block_mask=None, block_size=None,
                    q_descale=None, k_descale=None, v_descale=None):
    """flash_attn_varlen_func on packed qkv (total, 3, nheads, headdim)."""
    mods = _score_mods(attn_bias, attn_mask, block_mask, block_size)
    if not _is_torch(qkv):
        q, k, v = (_select(qkv, i, 3, "qkv") for i in range(3))
        return _array_attention(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                dropout_p, softmax_scale, causal, window_size, softcap,
                                alibi_slopes, return_attn_probs,
                                learnable_sink, check_cu_seqlens, mods,
                                (q_descale, k_descale, v_descale))
    cu_seqlens, _ = _torch_ops.varlen_metadata(
        qkv.device, _dim(qkv, 0), _dim(qkv, 0), cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
        check_cu_seqlens)
    wl, wr = _lowlevel.resolve_window(window_size)
    out, lse = _torch_ops.call_forward(
        _torch_ops.fwd_qkvpacked,
        qkv, cu_seqlens, max_seqlen, alibi_slopes, _lowlevel.resolve_scale(softmax_scale),
        bool(causal), wl, wr, _real("softcap", softcap), _real("dropout_p", dropout_p),
        _torch_ops.draw_rng_state(dropout_p), bool(deterministic), _torch_sink(learnable_sink),
        *_torch_tail(mods, _varlen_lengths(cu_seqlens, cu_seqlens, max_seqlen, max_seqlen),
                     _descales(q_descale, k_descale, v_descale, _dim(cu_seqlens, 0) - 1,
                               _dim(qkv, -2))))
    return _finish(out, lse, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False, learnable_sink=None, *,
                                    check_cu_seqlens=False, attn_bias=None, attn_mask=None,
                                    block_mask=None, block_size=None,
                    q_descale=None, k_descale=None, v_descale=None):
    """flash_attn_varlen_func with packed kv (total_k, 2, nheads_k, headdim)."""
    mods = _score_mods(attn_bias, attn_mask, block_mask, block_size)
    if not _is_torch(q):
        k, v = (_select(kv, i, 2, "kv") for i in range(2))
        return _array_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                                softcap, alibi_slopes, return_attn_probs,
                                learnable_sink, check_cu_seqlens, mods,
                                (q_descale, k_descale, v_descale))
    cu_seqlens_q, cu_seqlens_k = _torch_ops.varlen_metadata(
        q.device, _dim(q, 0), _dim(kv, 0), cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
        max_seqlen_k, check_cu_seqlens)
    wl, wr = _lowlevel.resolve_window(window_size)
    out, lse = _torch_ops.call_forward(
        _torch_ops.fwd_kvpacked,
        q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
        _lowlevel.resolve_scale(softmax_scale), bool(causal), wl, wr, _real("softcap", softcap),
        _real("dropout_p", dropout_p), _torch_ops.draw_rng_state(dropout_p), bool(deterministic),
        _torch_sink(learnable_sink),
        *_torch_tail(mods, _varlen_lengths(cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                           max_seqlen_k),
                     _descales(q_descale, k_descale, v_descale, _dim(cu_seqlens_q, 0) - 1,
                               _dim(kv, -2))))
    return _finish(out, lse, return_attn_probs)


def _seqlens_array(cache_seqlens, q, batch: int):
    """An int cache_seqlens as an int32 (batch,) array in q's framework and on q's device."""
    cache_seqlens = _lowlevel.int32("cache_seqlens", cache_seqlens)
    if _is_torch(q):
        return torch.full((batch,), cache_seqlens, dtype=torch.int32, device=q.device)
    out = _empty(q, (batch,), "int32")
    out[...] = cache_seqlens
    return out


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False, learnable_sink=None, *, q_descale=None,
                            k_descale=None, v_descale=None):
    """Attention of q against a KV cache, appending new keys/values first (incremental decoding).

    q: (batch, seqlen_q, nheads, headdim). k_cache, v_cache: (batch_cache, seqlen_cache, nheads_k,
    headdim), or with block_table (num_blocks, page_size, nheads_k, headdim): a paged cache, any
    page size. k, v: optional (batch, seqlen_new, nheads_k, headdim), written *in place* into the
    caches at rows cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1 before attending (the
    caches must be writable and have room; cache_seqlens is then required).
    rotary_cos, rotary_sin: optional (seqlen_ro >= cache capacity, rotary_dim / 2) in q's dtype:
    the new keys are rotated at their cache rows, q at cache_seqlens (+ its token index when
    causal or windowed). rotary_interleaved: pairs (0, 1), (2, 3)... (True) or (i, i +
    rotary_dim / 2) (False, GPT-NeoX). cache_seqlens: int or int32 (batch,): rows already in
    each cache (None: the whole cache). cache_batch_idx: int32 (batch,) cache row per sequence.
    cache_leftpad: int32 (batch,) first valid cache row. block_table: int32 (batch, max_blocks).
    Masks are bottom-right aligned over each sequence's keys [leftpad, cache_seqlens +
    seqlen_new). num_splits: CUDA split-KV (0 = from shapes, 1 = none). learnable_sink:
    (nheads,) sink logits (see the module docs); a sequence with no key gets out 0 and
    softmax_lse = the sink. FP8 KV cache: k_cache/v_cache in float8_e4m3fn with
    k_descale/v_descale float32 (batch, nheads_k) (or broadcast to it); q and k/v in bfloat16 or
    float16 (k/v are quantized into the cache as e4m3(x / descale)), or q, k, v all in
    float8_e4m3fn with q_descale too (out bfloat16). See the module docs.

    Returns out (batch, seqlen_q, nheads, headdim_v), or (out, softmax_lse) with
    return_softmax_lse (lse float32 (batch, nheads, seqlen_q)). No backward.
    """
    if isinstance(cache_seqlens, int):
        _shape("q", q)  # (a TypeError naming q when it is not an array)
        # (q of rank 0: no sequences, and the library names q's rank)
        cache_seqlens = _seqlens_array(cache_seqlens, q, max(_dim(q, 0), 0))
    if (q_descale is None and k_descale is None and v_descale is None and _C is not None
            and not _is_compiling()):
        # As in flash_attn_func: the whole call in the extension, or None for the path below.
        result = _C.torch_forward_kvcache(
            q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            cache_leftpad, block_table, alibi_slopes, softmax_scale, causal, window_size,
            softcap, rotary_interleaved, num_splits, learnable_sink, True)
        if result is not None:
            _torch_ops.last_route["forward"] = "fast"
            out, lse = _torch_ops.fast_result(result)
            return (out, lse) if return_softmax_lse else out
    wl, wr = _lowlevel.resolve_window(window_size)
    scale = _lowlevel.resolve_scale(softmax_scale)
    if _is_torch(q):
        descales = _descales(q_descale, k_descale, v_descale, _dim(q, 0), _dim(k_cache, -2))
        out, lse = _torch_ops.call_forward(
            _torch_ops.fwd_kvcache, q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
            cache_seqlens, cache_batch_idx, cache_leftpad, block_table, alibi_slopes, scale,
            bool(causal), wl, wr, _real("softcap", softcap), bool(rotary_interleaved),
            int(num_splits),
            _torch_sink(learnable_sink), *descales)
        return (out, lse) if return_softmax_lse else out
    q_shape, v_shape = _shape("q", q), _shape("v_cache", v_cache)
    _lowlevel.check_rank("q", q_shape, False)
    out = _empty(q, q_shape[:-1] + v_shape[-1:])
    lse = _empty(q, (q_shape[0], q_shape[2], q_shape[1]), "float32")
    _lowlevel.forward_kvcache(
        q, k_cache, v_cache, out, lse, k=k, v=v, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
        cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx,
        cache_leftpad=cache_leftpad, block_table=block_table, softmax_scale=softmax_scale,
        causal=causal, window_size=window_size, softcap=softcap,
        rotary_interleaved=rotary_interleaved, alibi_slopes=alibi_slopes, num_splits=num_splits,
        learnable_sink=learnable_sink, q_descale=q_descale, k_descale=k_descale,
        v_descale=v_descale)
    return (out, lse) if return_softmax_lse else out
