"""PyTorch integration: ``torch.library`` custom ops ``flashattn::*`` with fake (meta)
implementations and autograd formulas, so the public functions run eagerly, under autograd and
under ``torch.compile(fullgraph=True)`` without graph breaks.

Design
------
* One table (``_LAYOUTS``) describes the three operand layouts: unpacked ``q, k, v``, packed
  ``qkv`` and packed ``kv``. Each entry names its tensor inputs, its varlen arguments and how to
  split the inputs into q, k, v views (no copy) and allocate gradients. ``_define`` turns an
  entry into a forward op ``flashattn::fwd<suffix>`` and a backward op ``flashattn::bwd<suffix>``
  (schemas written from the table, so every op shares the option list ``_OPTIONS``), their fake
  implementations and the autograd formula. ``flashattn::fwd_kvcache`` (inference only; mutates
  the caches) is defined the same way from ``_KVCACHE_ARGS``; its last input is
  ``learnable_sink`` (default None), as for the other ops, but it has no backward.
  ``flashattn::fwd_paged`` (``_PAGED_ARGS``: flash_attn_varlen_func with ``block_table``, k and
  v pages) is forward only too; its registered backward raises NotImplementedError.
* Forward ops return ``(out, lse)``; backward ops return the gradients. Every output is
  allocated here with ``torch.empty`` on the input's device (contiguous), then filled by the
  extension, which never allocates. The fake implementations allocate the same shapes, dtypes
  and (contiguous) strides, so compiled graphs see exactly what eager execution produces.
* The packed layouts' backward writes dq, dk, dv straight into one packed gradient tensor.
  ``lse`` is marked non-differentiable: gradients flow through ``out`` only, as in flash_attn.
* Learnable sinks: ``learnable_sink`` (float32 (heads), default None) is the last input of every
  attention op. Backward ops return its gradient ``dsink`` after the other gradients, an empty
  (0,) tensor without a sink (custom ops cannot return None); autograd hands it back in the
  sink's position, None without a sink.
* Bias and masks (issue 18): ``attn_bias``, ``attn_mask``, ``block_mask`` (Tensor?, default
  None), ``block_size_q/k`` (default 0) and the compressed block mask's ``kv_num_blocks``,
  ``kv_indices``, ``full_kv_num_blocks``, ``full_kv_indices`` (Tensor?, default None) follow
  the sink (SCORE_MOD_OPTIONS; the Python functions unpack a ``flashattn.BlockMask`` into
  them). Backward ops take one more trailing argument, ``bias_grad`` (default False; autograd
  sets it when the bias requires grad), and return ``dbias`` (the bias's shape, in its dtype
  when 16-bit, else float32) after ``dsink``, an empty (0,) tensor when not requested; autograd
  hands it back in the bias's position, summed over expanded dimensions by autograd itself when
  the bias is an ``expand``ed view.
* FP8 (issue 21): the forward ops end with ``q_descale``, ``k_descale``, ``v_descale``
  (Tensor?, default None, float32 (batch, heads_k); _FWD_EXTRA, after the shared options, so the
  backward ops' positional schema is unchanged); float8_e4m3fn
  q/k/v (and caches) go to the extension as uint8 views named in its ``float8`` argument (torch
  exports float8 by DLPack only from 2.8 on), and write bfloat16 ``out``. Autograd refuses the
  backward of a float8 forward (NotImplementedError): FP8 is forward-only.
* Varlen metadata: ``varlen_metadata`` checks cu_seqlens on the host when that is free (CPU
  values for CUDA tensors) or asked for; inside the ops ``CHECK_CU_SEQLENS``
  (FLASHATTN_CHECK_CU_SEQLENS, read once at import) is passed as ``check_cu_seqlens``.
* Dropout: the wrapper draws a fresh 64-bit seed per call from torch's default CPU generator
  (``torch.manual_seed`` seeds it) as a CPU int64 tensor ``rng_state = [seed_hi32, seed_lo32]``.
  It is an input of the forward op and is saved for the backward, which therefore regenerates
  the same Philox keep mask. Being a CPU tensor it is read inside the op without a device sync.
  Under CUDA graph capture the seed is drawn once at capture time, so every replay uses the
  same dropout mask.
* Eager inference (no autograd graph to record; not compiling, jit-tracing, profiling or under a
  torch.func transform; no torch function or dispatch mode; plain cpu/cuda tensors) calls the
  forward ops' implementations directly (``call_forward``): the same code without the
  dispatcher's host time. Eager calls that record an autograd graph (same conditions, some
  input requires grad) run the op's own autograd formula (setup_context, backward) as an
  autograd.Function (``_EAGER_AUTOGRAD``), whose backward calls the backward implementation
  directly: torch's custom-op autograd wrapper costs ~0.3 ms per forward in torch 2.15
  (dev/NOTES.md). Everything else goes through the ops. ``last_route`` records the route of
  the latest forward and backward (for tests and bench/host_time.py).
* Fast path (issue 17): calls without bias, masks or FP8 hand the torch tensors themselves to
  the extension (``_C.torch_forward``, ``_C.torch_forward_kvcache``; python/src/torch_path.cpp),
  which reads pointers, shapes, strides, dtypes and devices through the CPython API,
  allocates out and lse (torch.empty_like / Tensor.new_empty, contiguous) and runs the call:
  no DLPack export, no keyword marshalling. It returns None for anything it does not take
  (then the code below runs, unchanged), so copies, conversions and errors are those of the
  DLPack path. ``flash_attn_func`` and
  ``flash_attn_with_kvcache`` call it first with ``direct=True`` (the extension then makes
  _direct_ok's checks too; torch.compile's is made in Python), and the ops' implementations
  call it with ``direct=False``. A direct call of flash_attn_func that records an autograd
  graph (the training call) returns True instead, and ``FuncAutograd`` runs it: the unpacked
  op's autograd formula with ``_C.torch_forward`` (direct=False) as its forward and
  ``_C.torch_backward`` (direct=True; gradients allocated in the extension) as its backward.
  The backward ops' implementation (``_run_bwd``) calls ``_C.torch_backward`` first too
  (direct=False; the packed layouts hand over their gradient's views).
* Host path: kernels run on the current stream of the tensors' GPU, read with
  ``torch._C._cuda_getCurrentRawStream`` (an int, no Stream object); the device guard is only
  entered when that GPU is not the current one. Nothing reads the environment per call.
  Inputs whose last dimension is not contiguous are copied (flash_attn does the same), and so
  are GPU inputs whose pointer or strides break the CUDA kernels' 16-byte copies.
"""

import atexit
import os
from typing import Callable, Optional, Sequence

import torch
from torch import Tensor
from torch.utils.dlpack import to_dlpack as _to_dlpack

from . import _C
from ._lowlevel import (BLOCK_LISTS, CHECK_CU_SEQLENS, check_rank, check_varlen_metadata, int32,
                        raise_error, resolve_scale, resolve_window)

if not hasattr(torch.library, "register_autograd"):
    raise ImportError(f"flashattn's torch integration needs torch >= 2.4, found {torch.__version__}")

_U64 = (1 << 64) - 1
_U32 = 1 << 32


def draw_rng_state(dropout_p: float) -> Optional[Tensor]:
    """A fresh dropout seed as a CPU int64 tensor [hi32, lo32], or None without dropout."""
    if dropout_p <= 0.0:
        return None
    return torch.randint(0, _U32, (2,), dtype=torch.int64, device="cpu")


def _seed_of(rng_state: Optional[Tensor]) -> int:
    if rng_state is None:
        return 0
    hi, lo = rng_state.tolist()
    return ((int(hi) << 32) | int(lo)) & _U64


def _kernel_ready(t: Tensor) -> Tensor:
    """t as the kernels read it: last dimension contiguous (flash_attn copies otherwise too) and,
    on a GPU, a 16-byte aligned pointer with strides in whole 16-byte chunks (8 elements: the
    CUDA kernels copy 16 bytes at a time). Anything else becomes a contiguous copy. None (a
    missing operand) stays None, for the library to name."""
    if t is None:
        return t
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        return t.contiguous()
    # A head dim that is not a multiple of 8 is never instantiated: the CUDA backend pads it
    # through its own strided copy, so copying here would only copy twice.
    if t.is_cuda and t.shape[-1] % 8 == 0 and (
            t.data_ptr() % 16 != 0 or any(st % 8 != 0 for st in t.stride()[:-1])):
        return t.clone(memory_format=torch.contiguous_format)
    return t


def _last_dim_ready(t: Optional[Tensor]) -> Optional[Tensor]:
    """A bias or mask with a contiguous last dimension (broadcast leading dimensions keep
    their stride 0)."""
    if t is None or t.stride(-1) == 1 or t.shape[-1] <= 1:
        return t
    return t.contiguous()


_FP8 = torch.float8_e4m3fn


def _plain(t: Optional[Tensor]):
    """What the extension receives for t: a DLPack capsule of t detached (DLPack refuses tensors
    that require grad). Handed the tensor itself, nanobind would call Tensor.__dlpack__, a Python
    method of about 2 us per tensor (five to ten tensors per call); the capsule is the same
    export without it. No stream synchronisation either way: the kernels run on the current
    stream, where the inputs were produced. float8_e4m3fn goes as a uint8 view of the same
    memory (named in the extension's ``float8`` argument by the caller)."""
    if t is None:
        return None
    if t.requires_grad:
        t = t.detach()
    return _to_dlpack(t.view(torch.uint8) if t.dtype == _FP8 else t)


def _float8_names(**tensors) -> Optional[tuple]:
    """The names of the float8_e4m3fn tensors among ``tensors`` (the extension's ``float8``)."""
    names = tuple(n for n, t in tensors.items() if t is not None and t.dtype == _FP8)
    return names or None


def _out_dtype(q: Tensor):
    """out's dtype: q's, bfloat16 for float8_e4m3fn q (docs/SEMANTICS.md, "FP8")."""
    return torch.bfloat16 if q.dtype == _FP8 else q.dtype


def _lse_shape(q: Tensor, varlen: bool) -> tuple:
    # Dense (batch, heads, seqlen_q); varlen (heads, total_q).
    if varlen:
        return (q.shape[1], q.shape[0])
    return (q.shape[0], q.shape[2], q.shape[1])


def _out_shape(q: Tensor, v: Optional[Tensor]) -> tuple:
    # Without v (a missing operand, which the library names) any out will do.
    return (*q.shape[:-1], q.shape[-1] if v is None else v.shape[-1])


def _dsink_like(q: Tensor, learnable_sink: Optional[Tensor]) -> Tensor:
    """The sink gradient's tensor: float32 (heads) with a sink, else empty (0,)."""
    n = learnable_sink.shape[0] if learnable_sink is not None else 0
    return torch.empty((n,), dtype=torch.float32, device=q.device)


def _sink_grad(learnable_sink: Optional[Tensor], dsink: Tensor) -> Optional[Tensor]:
    return dsink if learnable_sink is not None else None


def _dbias_like(q: Tensor, attn_bias: Optional[Tensor], bias_grad: bool) -> Tensor:
    """The bias gradient's tensor: shaped like attn_bias when requested, else (0,); in the bias's
    dtype when it is 16-bit (the kernels round once, as autograd's cast of a float32 gradient
    would; no float32 tensor and no cast), else float32."""
    shape = tuple(attn_bias.shape) if attn_bias is not None and bias_grad else (0,)
    dtype = attn_bias.dtype if attn_bias is not None and attn_bias.dtype in (torch.float16, torch.bfloat16) \
        else torch.float32
    return torch.empty(shape, dtype=dtype, device=q.device)


def varlen_metadata(device: torch.device, total_q: int, total_k: int, cu_seqlens_q,
                    cu_seqlens_k, max_seqlen_q, max_seqlen_k, check: bool) -> tuple:
    """cu_seqlens_q/k as the ops take them, checked where that is free or was asked for.

    * CPU cu_seqlens for CUDA tensors: their values are host memory, so they are checked here
      (no device synchronisation) and then copied to the tensors' device.
    * ``check`` (the ``check_cu_seqlens`` keyword): device values are read back synchronously
      and checked (the FLASHATTN_CHECK_CU_SEQLENS environment variable does the same inside
      the ops, also under torch.compile).
    Checks are skipped while torch.compile traces (there are no values to read then)."""
    if cu_seqlens_q is None or cu_seqlens_k is None:
        return cu_seqlens_q, cu_seqlens_k
    host_values = (device.type == "cuda" and cu_seqlens_q.device.type == "cpu"
                   and cu_seqlens_k.device.type == "cpu")
    if (host_values or check) and not torch.compiler.is_compiling():
        check_varlen_metadata(cu_seqlens_q, cu_seqlens_k, total_q, total_k, max_seqlen_q,
                              max_seqlen_k)
    if host_values:
        cu_seqlens_q = cu_seqlens_q.to(device, non_blocking=True)
        cu_seqlens_k = cu_seqlens_k.to(device, non_blocking=True)
    return cu_seqlens_q, cu_seqlens_k


# ---- where a call runs --------------------------------------------------------------------------

_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_get_device = getattr(torch._C, "_cuda_getDevice", None)


class _NoGuard:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return None


_NO_GUARD = _NoGuard()


def _launch(t: Tensor):
    """(device guard, stream, num_threads) for a call on t's device: the current stream of t's
    GPU (a guard only when that GPU is not current), or torch's intra-op thread count for CPU
    tensors (torch.set_num_threads)."""
    if not t.is_cuda:
        return _NO_GUARD, 0, torch.get_num_threads()
    index = t.device.index
    if _raw_stream is not None and _get_device is not None:
        guard = _NO_GUARD if _get_device() == index else torch.cuda.device(index)
        return guard, _raw_stream(index), 0
    return torch.cuda.device(index), torch.cuda.current_stream(t.device).cuda_stream, 0


# ---- the attention ops, from one table -----------------------------------------------------------

# The options every attention op takes after its tensors and varlen arguments, as
# (name, schema type[, default]). rng_state is the dropout seed (see draw_rng_state);
# learnable_sink (last, default None) the float32 (heads) sink logits.
_OPTIONS = (("alibi_slopes", "Tensor?"), ("softmax_scale", "float"), ("causal", "bool"),
            ("window_left", "SymInt"), ("window_right", "SymInt"), ("softcap", "float"),
            ("dropout_p", "float"), ("rng_state", "Tensor?"), ("deterministic", "bool"),
            ("learnable_sink", "Tensor?", "None"), ("attn_bias", "Tensor?", "None"),
            ("attn_mask", "Tensor?", "None"), ("block_mask", "Tensor?", "None"),
            ("block_size_q", "SymInt", "0"), ("block_size_k", "SymInt", "0"),
            *((name, "Tensor?", "None") for name in BLOCK_LISTS))
_N_OPTIONS = len(_OPTIONS)
_OPT_INDEX = {p[0]: i for i, p in enumerate(_OPTIONS)}
# The bias and mask options (attn_bias onwards), named as the extension's keywords and as
# _lowlevel.resolve_score_mods returns them.
SCORE_MOD_OPTIONS = tuple(p[0] for p in _OPTIONS[_OPT_INDEX["attn_bias"]:])
# Forward ops only, after the options: the FP8 descale factors.
_FWD_EXTRA = (("q_descale", "Tensor?", "None"), ("k_descale", "Tensor?", "None"),
              ("v_descale", "Tensor?", "None"))
_OPTION_DEFAULTS = tuple(None if len(p) < 3 or p[2] == "None" else int(p[2]) for p in _OPTIONS)
# Backward ops only: whether to compute dbias (after the options).
_BWD_EXTRA = (("bias_grad", "bool", "False"),)


def _full_options(opts: Sequence) -> tuple:
    """opts with the defaulted trailing options filled in (a direct call may omit the sink,
    bias and masks)."""
    return tuple(opts) + _OPTION_DEFAULTS[len(opts):]


# Varlen arguments: separate q/k sequences, or one set shared by q and k (packed qkv).
_VARLEN_QK = (("cu_seqlens_q", "Tensor?"), ("cu_seqlens_k", "Tensor?"), ("max_seqlen_q", "SymInt"),
              ("max_seqlen_k", "SymInt"))
_VARLEN_SHARED = (("cu_seqlens", "Tensor?"), ("max_seqlen", "SymInt"))


def _unpack(packed: Tensor, n: int, name: str) -> tuple:
    """Views q, k, v (or k, v) of a packed (..., n, heads, head_dim) tensor; no copy."""
    if packed.dim() < 3 or packed.shape[-3] != n:
        raise ValueError(
            f"{name} must have shape (..., {n}, heads, head_dim), got {tuple(packed.shape)}")
    return packed.unbind(-3)


def _empty(shape, like: Tensor) -> Tensor:
    return torch.empty(shape, dtype=like.dtype, device=like.device)


class _Layout:
    """How one family of ops holds q, k, v.

    inputs:  names of the op's tensor inputs
    varlen:  its varlen arguments (_VARLEN_QK or _VARLEN_SHARED)
    split:   inputs -> (q, k, v) views
    grads:   inputs -> (gradients the op returns, (dq, dk, dv) views the kernel writes)
    packed:  whether those views share one gradient tensor (else the extension's torch entry
             may allocate dq, dk, dv itself)
    """

    def __init__(self, suffix: str, inputs: Sequence[str], varlen, split: Callable,
                 grads: Callable, packed: bool):
        self.suffix, self.inputs, self.varlen = suffix, tuple(inputs), varlen
        self.split, self.grads, self.packed = split, grads, packed

    def varlen_qk(self, v: Sequence) -> tuple:
        """The varlen arguments as (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)."""
        return tuple(v) if len(v) == 4 else (v[0], v[0], v[1], v[1])


def _grads_unpacked(q, k, v):
    dq, dk, dv = _empty(q.shape, q), _empty(k.shape, k), _empty(v.shape, v)
    return (dq, dk, dv), (dq, dk, dv)


def _grads_qkvpacked(qkv):
    dqkv = _empty(qkv.shape, qkv)
    return (dqkv,), dqkv.unbind(-3)


def _grads_kvpacked(q, kv):
    dq, dkv = _empty(q.shape, q), _empty(kv.shape, kv)
    dk, dv = dkv.unbind(-3)
    return (dq, dkv), (dq, dk, dv)


_LAYOUTS = (
    _Layout("", ("q", "k", "v"), _VARLEN_QK, lambda q, k, v: (q, k, v), _grads_unpacked, False),
    _Layout("_qkvpacked", ("qkv",), _VARLEN_SHARED, lambda qkv: _unpack(qkv, 3, "qkv"),
            _grads_qkvpacked, True),
    _Layout("_kvpacked", ("q", "kv"), _VARLEN_QK, lambda q, kv: (q, *_unpack(kv, 2, "kv")),
            _grads_kvpacked, True),
)


# The score-mod keywords of a call without bias or masks (the common case), built once: a call
# that gives none of them skips the per-option conversion (host time, see call_forward).
_MOD_DEFAULTS = _OPTION_DEFAULTS[_OPT_INDEX["attn_bias"]:]
_NO_MODS = {name: (0 if name.startswith("block_size") else None) for name in SCORE_MOD_OPTIONS}


def _no_mods(opts: Sequence) -> bool:
    """Whether opts (full) give no bias or mask (block sizes at their default 0)."""
    return all(value is None or (type(value) is int and value == default)
               for value, default in zip(opts[_OPT_INDEX["attn_bias"]:], _MOD_DEFAULTS))


def fast_result(result: tuple) -> tuple:
    """(out, lse) from a torch fast-path entry of the extension (_C.torch_forward,
    _C.torch_forward_kvcache) that handled the call; raises the error it returned instead."""
    if type(result[0]) is str:
        raise_error(result)
    return result


def _options(lay: _Layout, varlen: Sequence, opts: Sequence, stream: int,
             num_threads: int) -> dict:
    """The extension's keyword arguments shared by _C.forward and _C.backward (the descales,
    forward only, are added by _run_fwd)."""
    cu_q, cu_k, max_q, max_k = lay.varlen_qk(varlen)
    alibi, scale, causal, wl, wr, softcap, p, rng, _, sink = opts[:_OPT_INDEX["attn_bias"]]
    tail = opts[_OPT_INDEX["attn_bias"]:]
    if _no_mods(opts):
        mods = _NO_MODS
    else:
        mods = {name: int(value) if name.startswith("block_size") else _plain(_last_dim_ready(value))
                for name, value in zip(SCORE_MOD_OPTIONS, tail)}
    return dict(**mods, cu_seqlens_q=_plain(cu_q), cu_seqlens_k=_plain(cu_k),
        max_seqlen_q=int32("max_seqlen_q", max_q), max_seqlen_k=int32("max_seqlen_k", max_k),
        alibi_slopes=_plain(alibi), softmax_scale=float(scale), causal=bool(causal),
        window_left=int(wl), window_right=int(wr), softcap=float(softcap), dropout_p=float(p),
        seed=_seed_of(rng), offset=0, check_cu_seqlens=CHECK_CU_SEQLENS,
        learnable_sink=_plain(sink), stream=stream, num_threads=num_threads)


def _run_fwd(lay: _Layout, args: tuple) -> tuple:
    n, nv = len(lay.inputs), len(lay.varlen)
    varlen, rest = args[n:n + nv], args[n + nv:]
    opts = _full_options(rest[:_N_OPTIONS])
    extra = tuple(rest[_N_OPTIONS:])
    qd, kd, vd = extra + (None,) * (len(_FWD_EXTRA) - len(extra))
    q, k, v = lay.split(*args[:n])
    if qd is None and kd is None and vd is None and _no_mods(opts):
        cu_q, cu_k, max_q, max_k = lay.varlen_qk(varlen)
        alibi, scale, causal, wl, wr, softcap, p, rng, _, sink = opts[:_OPT_INDEX["attn_bias"]]
        result = _C.torch_forward(q, k, v, cu_q, cu_k, max_q, max_k, alibi, scale, causal,
                                  (wl, wr), softcap, p, _seed_of(rng), sink, CHECK_CU_SEQLENS,
                                  False)
        if result is not None:
            return fast_result(result)
    is_varlen = varlen[0] is not None
    check_rank("q", q.shape, is_varlen)
    q, k, v = _kernel_ready(q), _kernel_ready(k), _kernel_ready(v)
    out = torch.empty(_out_shape(q, v), dtype=_out_dtype(q), device=q.device)
    lse = torch.empty(_lse_shape(q, is_varlen), dtype=torch.float32, device=q.device)
    guard, stream, threads = _launch(q)
    with guard:
        raise_error(_C.forward(_plain(q), _plain(k), _plain(v), _plain(out), _plain(lse),
                               q_descale=_plain(qd), k_descale=_plain(kd), v_descale=_plain(vd),
                               float8=_float8_names(q=q, k=k, v=v),
                               **_options(lay, varlen, opts, stream, threads)))
    return out, lse


def _run_bwd(lay: _Layout, args: tuple) -> tuple:
    """Returns the layout's gradients followed by dsink (float32 (heads) with a learnable
    sink, else an empty (0,) tensor: custom ops cannot return None) and dbias (like attn_bias,
    _dbias_like, when bias_grad, else (0,))."""
    n, nv = len(lay.inputs), len(lay.varlen)
    dout, inputs, out, lse = args[0], args[1:1 + n], args[1 + n], args[2 + n]
    varlen, tail = args[3 + n:3 + n + nv], args[3 + n + nv:]
    opts = _full_options(tail[:_N_OPTIONS])
    bias_grad = bool(tail[_N_OPTIONS]) if len(tail) > _N_OPTIONS else False
    result, (dq, dk, dv) = lay.grads(*inputs) if lay.packed else (None, (None,) * 3)
    if _no_mods(opts):
        # The extension's torch entry (the gradients of the unpacked layout allocated there);
        # None: the DLPack path below.
        cu_q, cu_k, max_q, max_k = lay.varlen_qk(varlen)
        alibi, scale, causal, wl, wr, softcap, p, rng, det, sink = opts[:_OPT_INDEX["attn_bias"]]
        fast = _C.torch_backward(dout, *lay.split(*inputs), out, lse, dq, dk, dv, cu_q, cu_k,
                                 max_q, max_k, alibi, sink, scale, causal, (wl, wr), softcap, p,
                                 _seed_of(rng), det, CHECK_CU_SEQLENS, False)
        if fast is not None:
            *grads, dsink = fast_result(fast)
            if not lay.packed:
                result = grads
            # Without a sink an empty dsink, and always an empty dbias (ops return no None).
            dsink = _dsink_like(dout, None) if dsink is None else dsink
            return (*result, dsink, _dbias_like(dout, None, False))
    q, k, v = (_kernel_ready(t) for t in lay.split(*inputs))
    dout = _kernel_ready(dout)
    if not lay.packed:
        result, (dq, dk, dv) = lay.grads(*inputs)
    sink, bias = opts[_OPT_INDEX["learnable_sink"]], opts[_OPT_INDEX["attn_bias"]]
    dsink = _dsink_like(q, sink)
    dbias = _dbias_like(q, bias, bias_grad)
    guard, stream, threads = _launch(q)
    with guard:
        raise_error(_C.backward(_plain(dout), _plain(q), _plain(k), _plain(v), _plain(out),
                                _plain(lse), _plain(dq), _plain(dk), _plain(dv),
                                deterministic=bool(opts[_OPT_INDEX["deterministic"]]),
                                dsink=_plain(dsink) if sink is not None else None,
                                dbias=_plain(dbias) if dbias.numel() > 0 else None,
                                **_options(lay, varlen, opts, stream, threads)))
    return (*result, dsink, dbias)


def _schema(params: Sequence[tuple], returns: str) -> str:
    """A schema string from (name, type[, default]) entries."""
    return ("(" + ", ".join(f"{p[1]} {p[0]}" + (f"={p[2]}" if len(p) > 2 else "")
                            for p in params) + ") -> " + returns)


_IMPLS = {}
_PARAMS = {}  # forward op -> its (name, schema type[, default]) parameters (check_tensor_arguments)
_EAGER_AUTOGRAD = {}  # forward op -> its autograd formula as an autograd.Function (_define)

# The route of the latest forward and backward (tests and bench/host_time.py read it; one dict
# store per call): "fast" (the extension's torch entry, no registered op: _C.torch_forward,
# _C.torch_forward_kvcache, _C.torch_backward), "fast_autograd" (FuncAutograd), "direct" (an
# op's implementation called directly), "eager_autograd" (_EAGER_AUTOGRAD) or "op".
last_route = {"forward": None, "backward": None}


def _run_backward_op(bwd, bwd_args: tuple, eager: bool) -> tuple:
    """A backward op's result for bwd_args. eager (an eager autograd.Function's backward): its
    implementation called directly when nothing needs the registered op (_route), as
    call_forward does."""
    if eager and _route(bwd_args) != _OP:
        last_route["backward"] = "direct"
        return _IMPLS[bwd](*bwd_args)
    last_route["backward"] = "op"
    return bwd(*bwd_args)


def _define(lay: _Layout):
    """Registers flashattn::fwd<suffix> and flashattn::bwd<suffix> for one layout; returns
    (forward op, backward op)."""
    n, nv = len(lay.inputs), len(lay.varlen)
    tensors = tuple((name, "Tensor") for name in lay.inputs)
    tail = lay.varlen + _OPTIONS
    grads = "(" + ", ".join(["Tensor"] * (n + 2)) + ")"  # inputs' gradients, dsink, dbias

    def fwd_impl(*args):
        return _run_fwd(lay, args)

    def bwd_impl(*args):
        return _run_bwd(lay, args)

    fwd = torch.library.custom_op(f"flashattn::fwd{lay.suffix}", fwd_impl, mutates_args=(),
                                  schema=_schema(tensors + tail + _FWD_EXTRA, "(Tensor, Tensor)"))
    bwd = torch.library.custom_op(
        f"flashattn::bwd{lay.suffix}", bwd_impl, mutates_args=(),
        schema=_schema((("dout", "Tensor"),) + tensors + (("out", "Tensor"), ("lse", "Tensor"))
                       + tail + _BWD_EXTRA, grads))

    @fwd.register_fake
    def _(*args):
        q, _, v = lay.split(*args[:n])
        is_varlen = args[n] is not None
        check_rank("q", q.shape, is_varlen)
        return (q.new_empty(_out_shape(q, v), dtype=_out_dtype(q)),
                q.new_empty(_lse_shape(q, is_varlen), dtype=torch.float32))

    @bwd.register_fake
    def _(dout, *args):
        tail = args[n + 2 + nv:]
        opts = _full_options(tail[:_N_OPTIONS])
        bias_grad = bool(tail[_N_OPTIONS]) if len(tail) > _N_OPTIONS else False
        q = lay.split(*args[:n])[0]
        return (*(t.new_empty(t.shape) for t in args[:n]),
                _dsink_like(q, opts[_OPT_INDEX["learnable_sink"]]),
                _dbias_like(q, opts[_OPT_INDEX["attn_bias"]], bias_grad))

    tensor_tail = [i for i, p in enumerate(tail) if p[1].startswith("Tensor")]

    def setup_context(ctx, inputs, output):
        out, lse = output
        rest = tuple(inputs[n:n + nv]) + _full_options(inputs[n + nv:n + nv + _N_OPTIONS])
        ctx.save_for_backward(*inputs[:n], out, lse, *(rest[i] for i in tensor_tail))
        ctx.rest = rest  # non-tensor entries are read from here; tensors from saved_tensors
        ctx.mark_non_differentiable(lse)

    def backward(ctx, dout, dlse, eager=False):
        """eager (EagerAutograd's backward): call the backward implementation directly when
        nothing needs the registered op (_route), as call_forward does."""
        saved = ctx.saved_tensors
        if any(t.dtype == _FP8 for t in saved[:n]):
            raise NotImplementedError(
                "flashattn has no backward for float8_e4m3fn inputs: the FP8 forward is "
                "inference-only (as in FlashAttention-3); train in bfloat16 or float16")
        rest = list(ctx.rest)
        for i, t in zip(tensor_tail, saved[n + 2:]):
            rest[i] = t
        bias_index = n + nv + _OPT_INDEX["attn_bias"]
        bias_grad = bool(ctx.needs_input_grad[bias_index]) if bias_index < len(
            ctx.needs_input_grad) else False
        bwd_args = (dout, *saved[:n], saved[n], saved[n + 1], *rest, bias_grad)
        *grads, dsink, dbias = _run_backward_op(bwd, bwd_args, eager)
        # No gradient for the varlen arguments and options, except the sink's and the bias's.
        option_grads = [None] * _N_OPTIONS
        option_grads[_OPT_INDEX["learnable_sink"]] = _sink_grad(rest[nv + _OPT_INDEX["learnable_sink"]],
                                                                dsink)
        option_grads[_OPT_INDEX["attn_bias"]] = dbias if bias_grad else None
        return tuple(grads) + (None,) * nv + tuple(option_grads) + (None,) * len(_FWD_EXTRA)

    fwd.register_autograd(backward, setup_context=setup_context)
    _IMPLS[fwd] = fwd_impl
    _IMPLS[bwd] = bwd_impl
    _PARAMS[fwd] = tensors + tail + _FWD_EXTRA

    class EagerAutograd(torch.autograd.Function):
        """The op's autograd formula (the same setup_context and backward) as a plain
        autograd.Function, for eager calls that record a graph (see call_forward): the custom
        op's autograd wrapper costs ~0.3 ms of host time per forward in torch 2.15
        (torch._library.utils.fill_defaults reads the schema's argument list, rebuilt per
        access, twice per argument; dev/NOTES.md, "Host path of flash_attn_func")."""

        @staticmethod
        def forward(ctx, *args):
            out, lse = fwd_impl(*args)
            setup_context(ctx, args, (out, lse))
            return out, lse

        @staticmethod
        def backward(ctx, dout, dlse):
            # One gradient per schema argument; those past the given arguments are None, which
            # autograd drops.
            return backward(ctx, dout, dlse, eager=True)

    _EAGER_AUTOGRAD[fwd] = EagerAutograd
    return fwd, bwd


(fwd, bwd), (fwd_qkvpacked, bwd_qkvpacked), (fwd_kvpacked, bwd_kvpacked) = (
    _define(lay) for lay in _LAYOUTS)


# ---- KV cache (inference; appends into the caches in place) ------------------------------------

_KVCACHE_ARGS = (("q", "Tensor"), ("k_cache", "Tensor(a!)"), ("v_cache", "Tensor(b!)"),
                 ("k", "Tensor?"), ("v", "Tensor?"), ("rotary_cos", "Tensor?"),
                 ("rotary_sin", "Tensor?"), ("cache_seqlens", "Tensor?"),
                 ("cache_batch_idx", "Tensor?"), ("cache_leftpad", "Tensor?"),
                 ("block_table", "Tensor?"), ("alibi_slopes", "Tensor?"),
                 ("softmax_scale", "float"), ("causal", "bool"), ("window_left", "SymInt"),
                 ("window_right", "SymInt"), ("softcap", "float"),
                 ("rotary_interleaved", "bool"), ("num_splits", "SymInt"),
                 ("learnable_sink", "Tensor?", "None"), ("q_descale", "Tensor?", "None"),
                 ("k_descale", "Tensor?", "None"), ("v_descale", "Tensor?", "None"))


def _fwd_kvcache_impl(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                      cache_batch_idx, cache_leftpad, block_table, alibi_slopes, softmax_scale,
                      causal, window_left, window_right, softcap, rotary_interleaved,
                      num_splits, learnable_sink=None, q_descale=None, k_descale=None,
                      v_descale=None):
    """Appends k/v into k_cache/v_cache (in place; they are never copied, so the caller's
    tensors change) and attends; returns (out, lse)."""
    if q_descale is None and k_descale is None and v_descale is None:
        result = _C.torch_forward_kvcache(
            q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            cache_leftpad, block_table, alibi_slopes, softmax_scale, causal,
            (window_left, window_right), softcap, rotary_interleaved, num_splits,
            learnable_sink, False)
        if result is not None:
            return fast_result(result)
    check_rank("q", q.shape, False)
    q = _kernel_ready(q)
    k = None if k is None else _kernel_ready(k)
    v = None if v is None else _kernel_ready(v)
    out = torch.empty(_out_shape(q, v_cache), dtype=_out_dtype(q), device=q.device)
    lse = torch.empty(_lse_shape(q, False), dtype=torch.float32, device=q.device)
    guard, stream, threads = _launch(q)
    with guard:
        raise_error(_C.forward_kvcache(
            _plain(q), _plain(k_cache), _plain(v_cache), _plain(k), _plain(v),
            _plain(rotary_cos), _plain(rotary_sin), _plain(cache_seqlens),
            _plain(cache_batch_idx), _plain(cache_leftpad), _plain(block_table),
            _plain(alibi_slopes), _plain(out), _plain(lse), float(softmax_scale), bool(causal),
            int(window_left), int(window_right), float(softcap), bool(rotary_interleaved),
            int32("num_splits", num_splits), stream, threads, _plain(learnable_sink),
            _plain(q_descale), _plain(k_descale), _plain(v_descale),
            _float8_names(q=q, k_cache=k_cache, v_cache=v_cache, k=k, v=v)))
    return out, lse


fwd_kvcache = torch.library.custom_op(
    "flashattn::fwd_kvcache", _fwd_kvcache_impl, mutates_args=("k_cache", "v_cache"),
    schema=_schema(_KVCACHE_ARGS, "(Tensor, Tensor)"))


@fwd_kvcache.register_fake
def _(q, k_cache, v_cache, *args):
    check_rank("q", q.shape, False)
    return (q.new_empty(_out_shape(q, v_cache), dtype=_out_dtype(q)),
            q.new_empty(_lse_shape(q, False), dtype=torch.float32))


_IMPLS[fwd_kvcache] = _fwd_kvcache_impl
_PARAMS[fwd_kvcache] = _KVCACHE_ARGS


# ---- paged K/V in a varlen call (flash_attn_varlen_func's block_table): forward only -----------

_PAGED_ARGS = (("q", "Tensor"), ("k", "Tensor"), ("v", "Tensor"), ("block_table", "Tensor"),
               ("cu_seqlens_q", "Tensor"), ("cu_seqlens_k", "Tensor"), ("max_seqlen_q", "SymInt"),
               ("max_seqlen_k", "SymInt"), ("alibi_slopes", "Tensor?"), ("softmax_scale", "float"),
               ("causal", "bool"), ("window_left", "SymInt"), ("window_right", "SymInt"),
               ("softcap", "float"), ("num_splits", "SymInt"), ("learnable_sink", "Tensor?", "None"),
               ("k_descale", "Tensor?", "None"), ("v_descale", "Tensor?", "None"))


def _fwd_paged_impl(q, k, v, block_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                    alibi_slopes, softmax_scale, causal, window_left, window_right, softcap,
                    num_splits, learnable_sink=None, k_descale=None, v_descale=None):
    """A varlen forward whose k and v are pages (num_blocks, page_size, heads_k, d) located
    through block_table; returns (out, lse). The pages are read, never written."""
    if k_descale is None and v_descale is None and num_splits == 0:  # (the fast path has no num_splits)
        result = _C.torch_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                  alibi_slopes, softmax_scale, causal, (window_left, window_right),
                                  softcap, 0.0, 0, learnable_sink, CHECK_CU_SEQLENS, False,
                                  block_table)
        if result is not None:
            return fast_result(result)
    check_rank("q", q.shape, True)
    q, k, v = _kernel_ready(q), _kernel_ready(k), _kernel_ready(v)
    out = torch.empty(_out_shape(q, v), dtype=_out_dtype(q), device=q.device)
    lse = torch.empty(_lse_shape(q, True), dtype=torch.float32, device=q.device)
    guard, stream, threads = _launch(q)
    with guard:
        raise_error(_C.forward(
            _plain(q), _plain(k), _plain(v), _plain(out), _plain(lse),
            cu_seqlens_q=_plain(cu_seqlens_q), cu_seqlens_k=_plain(cu_seqlens_k),
            alibi_slopes=_plain(alibi_slopes), max_seqlen_q=int32("max_seqlen_q", max_seqlen_q),
            max_seqlen_k=int32("max_seqlen_k", max_seqlen_k), softmax_scale=float(softmax_scale),
            causal=bool(causal), window_left=int(window_left), window_right=int(window_right),
            softcap=float(softcap), num_splits=int32("num_splits", num_splits),
            check_cu_seqlens=CHECK_CU_SEQLENS, stream=stream, num_threads=threads,
            learnable_sink=_plain(learnable_sink), k_descale=_plain(k_descale),
            v_descale=_plain(v_descale), float8=_float8_names(k=k, v=v),
            block_table=_plain(block_table)))
    return out, lse


fwd_paged = torch.library.custom_op("flashattn::fwd_paged", _fwd_paged_impl, mutates_args=(),
                                    schema=_schema(_PAGED_ARGS, "(Tensor, Tensor)"))


@fwd_paged.register_fake
def _(q, k, v, *args):
    check_rank("q", q.shape, True)
    return (q.new_empty(_out_shape(q, v), dtype=_out_dtype(q)),
            q.new_empty(_lse_shape(q, True), dtype=torch.float32))


def _paged_setup_context(ctx, inputs, output):
    return None


def _paged_backward(ctx, dout, dlse):
    raise NotImplementedError(
        "flash_attn_varlen_func with block_table (paged K/V) has no backward, as in flash_attn "
        "2.x: paged K/V is for inference; train with packed k and v")


torch.library.register_autograd("flashattn::fwd_paged", _paged_backward,
                                setup_context=_paged_setup_context)
_IMPLS[fwd_paged] = _fwd_paged_impl
_PARAMS[fwd_paged] = _PAGED_ARGS


# ---- eager inference without the dispatcher ---------------------------------------------------

# torch.func transforms wrap plain-looking tensors; without the query (older or odd builds) the
# direct path is never taken.
_functorch_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: True)
_is_compiling = torch.compiler.is_compiling
_jit_tracing = torch.jit.is_tracing
_mode_enabled = torch._C._is_torch_function_mode_enabled
_dispatch_depth = torch._C._len_torch_dispatch_stack
_profiling = torch.autograd._profiler_enabled
_grad_enabled = torch.is_grad_enabled


_OP, _DIRECT, _EAGER_GRAPH = 0, 1, 2


def _route(args) -> int:
    """How call_forward runs a call. _OP unless nothing needs the registered op: not compiling,
    not tracing with torch.jit, no torch.func transform, no torch function or dispatch mode, no
    profiler (which should show the op), every tensor a plain torch.Tensor (or Parameter) on
    cpu or cuda (meta tensors need the fake kernel). Then _DIRECT without an autograd graph to
    record, else _EAGER_GRAPH."""
    if (_is_compiling() or _jit_tracing() or _functorch_active() or _mode_enabled()
            or _dispatch_depth() > 0 or _profiling()):
        return _OP
    grad = _grad_enabled()
    route = _DIRECT
    for a in args:
        if isinstance(a, Tensor):
            if (type(a) is not Tensor and type(a) is not _Parameter) or not (a.is_cuda or a.is_cpu):
                return _OP
            if grad and a.requires_grad:
                route = _EAGER_GRAPH
    return route


def _direct_ok(args) -> bool:
    """Whether the op's implementation can run directly (_route: nothing needs the op and there
    is no autograd graph to record)."""
    return _route(args) == _DIRECT


_Parameter = torch.nn.Parameter


# The torch objects the extension's fast path uses (python/src/torch_path.cpp), handed over once.
# The queries are _direct_ok's, except torch.compile's, which callers check in Python (dynamo
# reads it as a constant while tracing).
raise_error(_C.torch_init(Tensor, torch.nn.Parameter, torch.empty_like,
                          (torch.float32, torch.float16, torch.bfloat16, torch.int32),
                          _raw_stream, _get_device, torch.get_num_threads, torch.is_grad_enabled,
                          (torch._C._is_tracing, _functorch_active, _mode_enabled,
                           _dispatch_depth, _profiling)))

# Workspaces of WORKSPACE_MIN_BYTES and more come from torch's caching allocator (the dbias
# partials over a broadcast batch reach gigabytes): kept between calls like torch's own tensors,
# counted by torch.cuda.memory_allocated and returned by torch.cuda.empty_cache. Smaller ones, and
# every one with FLASHATTN_TORCH_WORKSPACE=0, come from the library's pool, which keeps 1 GiB
# between calls and maps anything beyond afresh each call (flashattn.h, WorkspaceAllocator).
WORKSPACE_MIN_BYTES = 256 << 20
_raw_alloc = getattr(torch._C, "_cuda_cudaCachingAllocator_raw_alloc", None)
_raw_delete = getattr(torch._C, "_cuda_cudaCachingAllocator_raw_delete", None)
TORCH_WORKSPACE = (_raw_alloc is not None and _raw_delete is not None
                   and os.environ.get("FLASHATTN_TORCH_WORKSPACE", "1") != "0")
if TORCH_WORKSPACE:
    _C.torch_workspace_allocator(_raw_alloc, _raw_delete, WORKSPACE_MIN_BYTES)
    # Uninstalled at exit, before the interpreter finalises: no call then reaches Python.
    atexit.register(_C.torch_workspace_allocator, None, None, 0)


def call_forward(op, *args):
    """Runs a forward op. In eager inference (see _route) it calls the op's implementation
    directly: the same code, without the custom-op dispatcher's host time (tens of microseconds
    per call, which decides the latency of small calls). An eager call that records an autograd
    graph runs the op's autograd formula as an autograd.Function (_EAGER_AUTOGRAD: the same
    setup_context and backward, without the custom op's autograd wrapper). Otherwise it goes
    through the op, so torch.compile, tracers, transforms and dispatch modes see it."""
    route = _route(args)
    try:
        if route == _DIRECT:
            last_route["forward"] = "direct"
            return _IMPLS[op](*args)
        if route == _EAGER_GRAPH and op in _EAGER_AUTOGRAD:
            last_route["forward"] = "eager_autograd"
            return _EAGER_AUTOGRAD[op].apply(*args)
    except (AttributeError, TypeError):
        # These routes skip the op's schema check: name an argument that is not a tensor (a
        # list, a numpy array, a float) rather than report where the code tripped over it.
        check_tensor_arguments(op, args)
        raise
    last_route["forward"] = "op"
    return op(*args)


def check_tensor_arguments(op, args) -> None:
    """TypeError naming the first of ``args`` that is not a tensor where ``op``'s schema
    (_PARAMS) takes one (or None, where it is optional), as the op's own check would."""
    for (name, kind, *_), value in zip(_PARAMS.get(op, ()), args):
        optional = kind == "Tensor?"
        if (kind.startswith("Tensor") and not isinstance(value, Tensor)
                and not (optional and value is None)):
            raise TypeError(f"{name} must be a torch.Tensor{' or None' if optional else ''}, got "
                            f"{type(value).__name__}")


# ---- flash_attn_func's training call ------------------------------------------------------------

def _func_op_args(q, k, v, alibi_slopes, learnable_sink, softmax_scale, causal, window_size,
                  softcap, dropout_p, seed, deterministic) -> tuple:
    """FuncAutograd's arguments as the unpacked forward op takes them (bias, masks and FP8 at
    their defaults)."""
    wl, wr = resolve_window(window_size)
    rng_state = None
    if dropout_p > 0.0:
        rng_state = torch.tensor([seed >> 32, seed & (_U32 - 1)], dtype=torch.int64)
    return (q, k, v, None, None, 0, 0, alibi_slopes, resolve_scale(softmax_scale), bool(causal),
            wl, wr, float(softcap), float(dropout_p), rng_state, bool(deterministic),
            learnable_sink)


class FuncAutograd(torch.autograd.Function):
    """flash_attn_func's eager call that records an autograd graph, when the extension's direct
    call says it takes it (_C.torch_forward returned True: plain cpu/cuda tensors, no bias, masks
    or FP8, a float32 contiguous sink, none of _route's reasons for the op). The unpacked op's
    autograd formula (_define's setup_context and backward: the same saved tensors, the same
    library calls, so the same values bit for bit) with the host side in the extension: the
    forward is _C.torch_forward (direct=False), the backward _C.torch_backward, which allocates
    the gradients itself. Against EagerAutograd it skips the op arguments' assembly and _route
    in Python, forward and backward (dev/NOTES.md, "Host time of the training call"). A
    backward the extension declines (dout not contiguous in its last dimension, compiled
    autograd, a mode entered for the backward, create_graph) runs the op's backward as
    EagerAutograd's does.

    Per call it records no more than the call needs: lse is an output only when the caller
    returns it (return_lse; saved for the backward either way), and undefined gradients are not
    materialised (set_materialize_grads(False)): with lse an output, autograd would otherwise
    allocate and zero-fill a dlse for every backward (an allocation and a fill kernel on a GPU)
    that the formula never reads."""

    @staticmethod
    def forward(ctx, q, k, v, alibi_slopes, learnable_sink, softmax_scale, causal, window_size,
                softcap, dropout_p, seed, deterministic, return_lse):
        result = _C.torch_forward(q, k, v, None, None, 0, 0, alibi_slopes, softmax_scale, causal,
                                  window_size, softcap, dropout_p, seed, learnable_sink,
                                  CHECK_CU_SEQLENS, False)
        if result is None:  # the direct call took it, so this is not expected; the op's code
            out, lse = _run_fwd(_LAYOUTS[0], _func_op_args(
                q, k, v, alibi_slopes, learnable_sink, softmax_scale, causal, window_size,
                softcap, dropout_p, seed, deterministic))
        else:
            out, lse = fast_result(result)
        ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, learnable_sink)
        ctx.options = (softmax_scale, causal, window_size, softcap, dropout_p, seed, deterministic)
        ctx.set_materialize_grads(False)
        if return_lse:
            ctx.mark_non_differentiable(lse)
            return out, lse
        return out

    @staticmethod
    def backward(ctx, dout, dlse=None):
        if dout is None:  # no gradient reached out (lse has none): every input's is zero
            return (None,) * 13
        q, k, v, out, lse, alibi_slopes, sink = ctx.saved_tensors
        scale, causal, window_size, softcap, dropout_p, seed, deterministic = ctx.options
        result = None if _is_compiling() else _C.torch_backward(
            dout, q, k, v, out, lse, None, None, None, None, None, 0, 0, alibi_slopes, sink, scale,
            causal, window_size, softcap, dropout_p, seed, deterministic, False, True)
        if result is not None:
            last_route["backward"] = "fast"
            dq, dk, dv, dsink = fast_result(result)
        else:
            args = _func_op_args(q, k, v, alibi_slopes, sink, scale, causal, window_size, softcap,
                                 dropout_p, seed, deterministic)
            bwd_args = (dout, q, k, v, out, lse, *args[3:7], *_full_options(args[7:]), False)
            dq, dk, dv, dsink, _ = _run_backward_op(bwd, bwd_args, True)
            dsink = _sink_grad(sink, dsink)
        return dq, dk, dv, None, dsink, None, None, None, None, None, None, None, None


def func_autograd(q, k, v, alibi_slopes, softmax_scale, causal, window_size, softcap, dropout_p,
                  deterministic, learnable_sink, return_lse):
    """flash_attn_func's call through FuncAutograd: (out, lse) with return_lse, else out,
    drawing the dropout seed as the op path does (draw_rng_state)."""
    last_route["forward"] = "fast_autograd"
    seed = 0 if dropout_p <= 0.0 else _seed_of(draw_rng_state(dropout_p))
    return FuncAutograd.apply(q, k, v, alibi_slopes, learnable_sink, softmax_scale, causal,
                              window_size, softcap, dropout_p, seed, deterministic, return_lse)
