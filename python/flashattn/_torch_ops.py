"""PyTorch integration: ``torch.library`` custom ops ``flashattn::*`` with fake (meta)
implementations and autograd formulas, so the public functions run eagerly, under autograd and
under ``torch.compile(fullgraph=True)`` without graph breaks.

Design
------
* Forward ops return ``(out, lse)``; backward ops return the gradients. Every output is
  allocated here with ``torch.empty`` on the input's device (contiguous), then filled by the
  extension, which never allocates. The fake implementations allocate the same shapes, dtypes
  and (contiguous) strides, so compiled graphs see exactly what eager execution produces.
* The packed layouts have their own ops (``fwd_qkvpacked``/``bwd_qkvpacked``,
  ``fwd_kvpacked``/``bwd_kvpacked``): q, k and v are strided views of the packed tensor (no
  copy), and the backward writes dq, dk, dv straight into one packed gradient tensor.
* Autograd is attached with ``torch.library.register_autograd`` (which builds the
  ``torch.autograd.Function`` for us). ``lse`` is marked non-differentiable: gradients flow
  through ``out`` only, as in flash_attn.
* Dropout: the wrapper draws a fresh 64-bit seed per call from torch's default CPU generator
  (``torch.manual_seed`` seeds it) as a CPU int64 tensor ``rng_state = [seed_hi32, seed_lo32]``.
  It is an input of the forward op and is saved for the backward, which therefore regenerates
  the same Philox keep mask. Being a CPU tensor it is read inside the op without a device sync.
  Under CUDA graph capture the seed is drawn once at capture time, so every replay uses the
  same dropout mask.
* Eager inference (no autograd graph to record; not compiling, jit-tracing, profiling or under a
  torch.func transform; no torch function or dispatch mode; plain cpu/cuda tensors) calls the
  forward ops' implementations directly (``call_forward``): the same code without the
  dispatcher's host time. Everything else goes through the ops.
* Kernels run on ``torch.cuda.current_stream(device)`` under a device guard for the tensors'
  GPU; CPU tensors use ``torch.get_num_threads()`` worker threads. Inputs whose last dimension
  is not contiguous are copied (flash_attn does the same), and so are GPU inputs whose pointer
  or strides break the CUDA kernels' 16-byte copies.
"""

from typing import Optional

import torch
from torch import Tensor
from torch.utils.dlpack import to_dlpack as _to_dlpack

from . import _C
from ._lowlevel import CHECK_CU_SEQLENS, check_rank, check_varlen_metadata, int32, raise_error

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
    CUDA kernels copy 16 bytes at a time). Anything else becomes a contiguous copy."""
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        return t.contiguous()
    # A head dim that is not a multiple of 8 is never instantiated: the CUDA backend pads it
    # through its own strided copy, so copying here would only copy twice.
    if t.is_cuda and t.shape[-1] % 8 == 0 and (
            t.data_ptr() % 16 != 0 or any(st % 8 != 0 for st in t.stride()[:-1])):
        return t.clone(memory_format=torch.contiguous_format)
    return t


def _plain(t: Optional[Tensor]):
    """What the extension receives for t: a DLPack capsule of t detached (DLPack refuses tensors
    that require grad). Handed the tensor itself, nanobind would call Tensor.__dlpack__, a Python
    method of about 2 us per tensor (five to ten tensors per call); the capsule is the same
    export without it. No stream synchronisation either way: the kernels run on the current
    stream, where the inputs were produced."""
    return None if t is None else _to_dlpack(t.detach() if t.requires_grad else t)


def _lse_shape(q: Tensor, varlen: bool) -> tuple:
    # Dense (batch, heads, seqlen_q); varlen (heads, total_q).
    if varlen:
        return (q.shape[1], q.shape[0])
    return (q.shape[0], q.shape[2], q.shape[1])


def _out_shape(q: Tensor, v: Tensor) -> tuple:
    return (*q.shape[:-1], v.shape[-1])


class _Launch:
    """Where one extension call runs: for CUDA tensors a device guard and the current stream of
    their device; for CPU tensors torch's intra-op thread count (torch.set_num_threads)."""

    def __init__(self, t: Tensor):
        self.device = t.device
        self._guard = None

    def __enter__(self) -> dict:
        if self.device.type != "cuda":
            return dict(stream=0, num_threads=torch.get_num_threads())
        self._guard = torch.cuda.device(self.device)
        self._guard.__enter__()
        return dict(stream=torch.cuda.current_stream(self.device).cuda_stream, num_threads=0)

    def __exit__(self, *exc) -> None:
        if self._guard is not None:
            self._guard.__exit__(*exc)


def _options(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
             softmax_scale, causal, window_left, window_right, softcap, dropout_p,
             rng_state, launch) -> dict:
    return dict(
        cu_seqlens_q=_plain(cu_seqlens_q), cu_seqlens_k=_plain(cu_seqlens_k),
        max_seqlen_q=int32("max_seqlen_q", max_seqlen_q),
        max_seqlen_k=int32("max_seqlen_k", max_seqlen_k),
        alibi_slopes=_plain(alibi_slopes), softmax_scale=float(softmax_scale),
        causal=bool(causal), window_left=int(window_left), window_right=int(window_right),
        softcap=float(softcap), dropout_p=float(dropout_p), seed=_seed_of(rng_state),
        offset=0, check_cu_seqlens=CHECK_CU_SEQLENS, **launch)


def _run_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
             softmax_scale, causal, window_left, window_right, softcap, dropout_p, rng_state,
             learnable_sink=None):
    varlen = cu_seqlens_q is not None
    check_rank("q", q.shape, varlen)
    q, k, v = _kernel_ready(q), _kernel_ready(k), _kernel_ready(v)
    out = torch.empty(_out_shape(q, v), dtype=q.dtype, device=q.device)
    lse = torch.empty(_lse_shape(q, varlen), dtype=torch.float32, device=q.device)
    with _Launch(q) as launch:
        raise_error(_C.forward(_plain(q), _plain(k), _plain(v), _plain(out), _plain(lse),
                               **_options(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                          alibi_slopes, softmax_scale, causal, window_left,
                                          window_right, softcap, dropout_p, rng_state, launch),
                               learnable_sink=_plain(learnable_sink)))
    return out, lse


def _run_bwd(dout, q, k, v, out, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
             max_seqlen_k, alibi_slopes, softmax_scale, causal, window_left, window_right,
             softcap, dropout_p, rng_state, deterministic, learnable_sink=None):
    """Writes dq, dk, dv; returns dsink (float32 (heads)) with a learnable sink, else an empty
    tensor (custom ops cannot return None)."""
    q, k, v = _kernel_ready(q), _kernel_ready(k), _kernel_ready(v)
    dsink = _dsink_like(q, learnable_sink)
    dout = _kernel_ready(dout)
    with _Launch(q) as launch:
        raise_error(_C.backward(_plain(dout), _plain(q), _plain(k), _plain(v), _plain(out),
                                _plain(lse), _plain(dq), _plain(dk), _plain(dv),
                                deterministic=bool(deterministic),
                                **_options(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                           alibi_slopes, softmax_scale, causal, window_left,
                                           window_right, softcap, dropout_p, rng_state, launch),
                                learnable_sink=_plain(learnable_sink),
                                dsink=_plain(dsink) if learnable_sink is not None else None))
    return dsink


def _dsink_like(q: Tensor, learnable_sink: Optional[Tensor]) -> Tensor:
    """The sink gradient's tensor: float32 (heads) with a sink, else empty (0,)."""
    n = learnable_sink.shape[0] if learnable_sink is not None else 0
    return torch.empty((n,), dtype=torch.float32, device=q.device)


def _sink_grad(learnable_sink: Optional[Tensor], dsink: Tensor) -> Optional[Tensor]:
    return dsink if learnable_sink is not None else None


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


def _empty(shape, like: Tensor) -> Tensor:
    return torch.empty(shape, dtype=like.dtype, device=like.device)


def _unpack(packed: Tensor, n: int, name: str) -> tuple:
    """Views q, k, v (or k, v) of a packed (..., n, heads, head_dim) tensor; no copy."""
    if packed.dim() < 3 or packed.shape[-3] != n:
        raise ValueError(
            f"{name} must have shape (..., {n}, heads, head_dim), got {tuple(packed.shape)}")
    return packed.unbind(-3)


# ---- unpacked q, k, v -------------------------------------------------------------------------

def _fwd_impl(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Optional[Tensor],
        cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
        alibi_slopes: Optional[Tensor], softmax_scale: float, causal: bool, window_left: int,
        window_right: int, softcap: float, dropout_p: float, rng_state: Optional[Tensor],
        deterministic: bool, learnable_sink: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """Attention forward; returns (out, lse)."""
    return _run_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                    alibi_slopes, softmax_scale, causal, window_left, window_right, softcap,
                    dropout_p, rng_state, learnable_sink)


fwd = torch.library.custom_op("flashattn::fwd", mutates_args=())(_fwd_impl)


@fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes,
      softmax_scale, causal, window_left, window_right, softcap, dropout_p, rng_state,
      deterministic, learnable_sink=None):
    varlen = cu_seqlens_q is not None
    check_rank("q", q.shape, varlen)
    return (q.new_empty(_out_shape(q, v)),
            q.new_empty(_lse_shape(q, varlen), dtype=torch.float32))


@torch.library.custom_op("flashattn::bwd", mutates_args=())
def bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
        cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor], max_seqlen_q: int,
        max_seqlen_k: int, alibi_slopes: Optional[Tensor], softmax_scale: float, causal: bool,
        window_left: int, window_right: int, softcap: float, dropout_p: float,
        rng_state: Optional[Tensor], deterministic: bool,
        learnable_sink: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Attention backward; returns (dq, dk, dv, dsink) (dsink empty without a sink)."""
    dq, dk, dv = _empty(q.shape, q), _empty(k.shape, k), _empty(v.shape, v)
    dsink = _run_bwd(dout, q, k, v, out, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                     max_seqlen_q, max_seqlen_k, alibi_slopes, softmax_scale, causal,
                     window_left, window_right, softcap, dropout_p, rng_state, deterministic,
                     learnable_sink)
    return dq, dk, dv, dsink


@bwd.register_fake
def _(dout, q, k, v, *args):
    sink = args[15] if len(args) > 15 else None
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            _dsink_like(q, sink))


def _setup_fwd(ctx, inputs, output):
    (q, k, v, cu_q, cu_k, max_q, max_k, alibi, scale, causal, wl, wr, softcap, p, rng,
     det, sink) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, alibi, rng, sink)
    ctx.options = (max_q, max_k, scale, causal, wl, wr, softcap, p, det)
    ctx.mark_non_differentiable(lse)


def _backward_fwd(ctx, dout, dlse):
    q, k, v, out, lse, cu_q, cu_k, alibi, rng, sink = ctx.saved_tensors
    max_q, max_k, scale, causal, wl, wr, softcap, p, det = ctx.options
    dq, dk, dv, dsink = bwd(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, alibi, scale,
                            causal, wl, wr, softcap, p, rng, det, sink)
    return (dq, dk, dv) + (None,) * 13 + (_sink_grad(sink, dsink),)


fwd.register_autograd(_backward_fwd, setup_context=_setup_fwd)


# ---- packed qkv: (batch, seqlen, 3, heads, head_dim) or varlen (total, 3, heads, head_dim) --

def _fwd_qkvpacked_impl(qkv: Tensor, cu_seqlens: Optional[Tensor], max_seqlen: int,
                  alibi_slopes: Optional[Tensor], softmax_scale: float, causal: bool,
                  window_left: int, window_right: int, softcap: float, dropout_p: float,
                  rng_state: Optional[Tensor], deterministic: bool,
                  learnable_sink: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """Attention forward on packed qkv; returns (out, lse)."""
    q, k, v = _unpack(qkv, 3, "qkv")
    return _run_fwd(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, alibi_slopes,
                    softmax_scale, causal, window_left, window_right, softcap, dropout_p,
                    rng_state, learnable_sink)


fwd_qkvpacked = torch.library.custom_op("flashattn::fwd_qkvpacked", mutates_args=())(_fwd_qkvpacked_impl)


@fwd_qkvpacked.register_fake
def _(qkv, cu_seqlens, *args):
    q, _, v = _unpack(qkv, 3, "qkv")
    varlen = cu_seqlens is not None
    check_rank("q", q.shape, varlen)
    return (q.new_empty(_out_shape(q, v)),
            q.new_empty(_lse_shape(q, varlen), dtype=torch.float32))


@torch.library.custom_op("flashattn::bwd_qkvpacked", mutates_args=())
def bwd_qkvpacked(dout: Tensor, qkv: Tensor, out: Tensor, lse: Tensor,
                  cu_seqlens: Optional[Tensor], max_seqlen: int,
                  alibi_slopes: Optional[Tensor], softmax_scale: float, causal: bool,
                  window_left: int, window_right: int, softcap: float, dropout_p: float,
                  rng_state: Optional[Tensor], deterministic: bool,
                  learnable_sink: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """Attention backward on packed qkv; returns (dqkv, dsink): dqkv written through views
    (no copy), dsink empty without a sink."""
    q, k, v = _unpack(qkv, 3, "qkv")
    dqkv = _empty(qkv.shape, qkv)
    dq, dk, dv = dqkv.unbind(-3)
    dsink = _run_bwd(dout, q, k, v, out, lse, dq, dk, dv, cu_seqlens, cu_seqlens, max_seqlen,
                     max_seqlen, alibi_slopes, softmax_scale, causal, window_left, window_right,
                     softcap, dropout_p, rng_state, deterministic, learnable_sink)
    return dqkv, dsink


@bwd_qkvpacked.register_fake
def _(dout, qkv, *args):
    sink = args[13] if len(args) > 13 else None
    return qkv.new_empty(qkv.shape), _dsink_like(qkv, sink)


def _setup_fwd_qkvpacked(ctx, inputs, output):
    qkv, cu, max_s, alibi, scale, causal, wl, wr, softcap, p, rng, det, sink = inputs
    out, lse = output
    ctx.save_for_backward(qkv, out, lse, cu, alibi, rng, sink)
    ctx.options = (max_s, scale, causal, wl, wr, softcap, p, det)
    ctx.mark_non_differentiable(lse)


def _backward_fwd_qkvpacked(ctx, dout, dlse):
    qkv, out, lse, cu, alibi, rng, sink = ctx.saved_tensors
    max_s, scale, causal, wl, wr, softcap, p, det = ctx.options
    dqkv, dsink = bwd_qkvpacked(dout, qkv, out, lse, cu, max_s, alibi, scale, causal, wl, wr,
                                softcap, p, rng, det, sink)
    return (dqkv,) + (None,) * 11 + (_sink_grad(sink, dsink),)


fwd_qkvpacked.register_autograd(_backward_fwd_qkvpacked, setup_context=_setup_fwd_qkvpacked)


# ---- packed kv: kv (batch, seqlen_k, 2, heads_k, head_dim) or varlen (total_k, 2, ...) ----

def _fwd_kvpacked_impl(q: Tensor, kv: Tensor, cu_seqlens_q: Optional[Tensor],
                 cu_seqlens_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int,
                 alibi_slopes: Optional[Tensor], softmax_scale: float, causal: bool,
                 window_left: int, window_right: int, softcap: float, dropout_p: float,
                 rng_state: Optional[Tensor], deterministic: bool,
                 learnable_sink: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """Attention forward on q and packed kv; returns (out, lse)."""
    k, v = _unpack(kv, 2, "kv")
    return _run_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                    alibi_slopes, softmax_scale, causal, window_left, window_right, softcap,
                    dropout_p, rng_state, learnable_sink)


fwd_kvpacked = torch.library.custom_op("flashattn::fwd_kvpacked", mutates_args=())(_fwd_kvpacked_impl)


@fwd_kvpacked.register_fake
def _(q, kv, cu_seqlens_q, *args):
    _, v = _unpack(kv, 2, "kv")
    varlen = cu_seqlens_q is not None
    check_rank("q", q.shape, varlen)
    return (q.new_empty(_out_shape(q, v)),
            q.new_empty(_lse_shape(q, varlen), dtype=torch.float32))


@torch.library.custom_op("flashattn::bwd_kvpacked", mutates_args=())
def bwd_kvpacked(dout: Tensor, q: Tensor, kv: Tensor, out: Tensor, lse: Tensor,
                 cu_seqlens_q: Optional[Tensor], cu_seqlens_k: Optional[Tensor],
                 max_seqlen_q: int, max_seqlen_k: int, alibi_slopes: Optional[Tensor],
                 softmax_scale: float, causal: bool, window_left: int, window_right: int,
                 softcap: float, dropout_p: float, rng_state: Optional[Tensor],
                 deterministic: bool,
                 learnable_sink: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    """Attention backward on q and packed kv; returns (dq, dkv, dsink) (dsink empty without a
    sink)."""
    k, v = _unpack(kv, 2, "kv")
    dq = _empty(q.shape, q)
    dkv = _empty(kv.shape, kv)
    dk, dv = dkv.unbind(-3)
    dsink = _run_bwd(dout, q, k, v, out, lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                     max_seqlen_q, max_seqlen_k, alibi_slopes, softmax_scale, causal,
                     window_left, window_right, softcap, dropout_p, rng_state, deterministic,
                     learnable_sink)
    return dq, dkv, dsink


@bwd_kvpacked.register_fake
def _(dout, q, kv, *args):
    sink = args[15] if len(args) > 15 else None
    return q.new_empty(q.shape), kv.new_empty(kv.shape), _dsink_like(q, sink)


def _setup_fwd_kvpacked(ctx, inputs, output):
    (q, kv, cu_q, cu_k, max_q, max_k, alibi, scale, causal, wl, wr, softcap, p, rng,
     det, sink) = inputs
    out, lse = output
    ctx.save_for_backward(q, kv, out, lse, cu_q, cu_k, alibi, rng, sink)
    ctx.options = (max_q, max_k, scale, causal, wl, wr, softcap, p, det)
    ctx.mark_non_differentiable(lse)


def _backward_fwd_kvpacked(ctx, dout, dlse):
    q, kv, out, lse, cu_q, cu_k, alibi, rng, sink = ctx.saved_tensors
    max_q, max_k, scale, causal, wl, wr, softcap, p, det = ctx.options
    dq, dkv, dsink = bwd_kvpacked(dout, q, kv, out, lse, cu_q, cu_k, max_q, max_k, alibi,
                                  scale, causal, wl, wr, softcap, p, rng, det, sink)
    return (dq, dkv) + (None,) * 13 + (_sink_grad(sink, dsink),)


fwd_kvpacked.register_autograd(_backward_fwd_kvpacked, setup_context=_setup_fwd_kvpacked)


# ---- eager inference without the dispatcher ---------------------------------------------------

_IMPLS = {fwd: _fwd_impl, fwd_qkvpacked: _fwd_qkvpacked_impl, fwd_kvpacked: _fwd_kvpacked_impl}


# torch.func transforms wrap plain-looking tensors; without the query (older or odd builds) the
# direct path is never taken.
_functorch_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: True)


def _direct_ok(args) -> bool:
    """Whether nothing needs the registered op: not compiling, not tracing with torch.jit, no
    torch.func transform, no torch function or dispatch mode, no profiler (which should show the
    op), every tensor a plain torch.Tensor on cpu or cuda (meta tensors need the fake kernel),
    and no autograd graph to record."""
    if (torch.compiler.is_compiling() or torch.jit.is_tracing()
            or _functorch_active()
            or torch._C._is_torch_function_mode_enabled() or torch._C._len_torch_dispatch_stack() > 0
            or torch.autograd._profiler_enabled()):
        return False
    grad = torch.is_grad_enabled()
    for a in args:
        if isinstance(a, Tensor) and (type(a) is not Tensor or not (a.is_cuda or a.is_cpu)
                                      or (grad and a.requires_grad)):
            return False
    return True


def call_forward(op, *args):
    """Runs a forward op. In eager inference (see _direct_ok) it calls the op's implementation
    directly: the same code, without the custom-op dispatcher's host time (tens of microseconds
    per call, which decides the latency of small calls). Otherwise it goes through the op, so
    autograd, torch.compile and dispatch modes see it."""
    return _IMPLS[op](*args) if _direct_ok(args) else op(*args)

