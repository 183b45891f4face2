"""The torch fast path (python/src/torch_path.cpp, issue 17): flash_attn_func and
flash_attn_with_kvcache read torch tensors in C++ and allocate their outputs there. It must
take the common calls, decline everything else before doing anything (the DLPack path then
runs unchanged), and give bitwise the DLPack path's results and the same errors."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
from flashattn import _C, _torch_ops  # noqa: E402


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def randn(*shape, g, dtype=torch.float32):
    return torch.randn(*shape, generator=g, dtype=dtype)


@pytest.fixture
def dlpack_only(monkeypatch):
    """Turns the fast path off: its entries decline every call."""
    def off(monkey=monkeypatch):
        monkey.setattr(_C, "torch_forward", lambda *a: None)
        monkey.setattr(_C, "torch_forward_kvcache", lambda *a: None)
        monkey.setattr(_C, "torch_backward", lambda *a: None)
    return off


def both_paths(fn, dlpack_only, monkeypatch):
    """fn() with the fast path, then with the DLPack path only."""
    fast = fn()
    with monkeypatch.context() as m:
        dlpack_only(m)
        slow = fn()
    return fast, slow


def outcome(fn):
    """fn()'s result, or (exception type, message)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - compared, not handled
        return type(e), str(e)


def assert_same(a, b):
    if isinstance(a, tuple) and a and isinstance(a[0], type):
        assert a == b
        return
    a = a if isinstance(a, (tuple, list)) else (a,)
    b = b if isinstance(b, (tuple, list)) else (b,)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if x is None:
            assert y is None
            continue
        assert x.dtype == y.dtype and x.shape == y.shape and x.stride() == y.stride()
        assert torch.equal(x, y)


def decode_inputs(g, b=2, sq=1, sk=19, h=8, hk=2, d=32, dtype=torch.float32):
    return (randn(b, sq, h, d, g=g, dtype=dtype), randn(b, sk, hk, d, g=g, dtype=dtype),
            randn(b, sk, hk, d, g=g, dtype=dtype))


def fast_forward(q, k, v, direct=True, **kw):
    """_C.torch_forward as flash_attn_func calls it, with keywords for the options."""
    o = dict(alibi_slopes=None, softmax_scale=None, causal=False, window_size=(-1, -1),
             softcap=0.0, dropout_p=0.0, learnable_sink=None)
    o.update(kw)
    return _C.torch_forward(q, k, v, None, None, 0, 0, o["alibi_slopes"], o["softmax_scale"],
                            o["causal"], o["window_size"], o["softcap"], o["dropout_p"], 0,
                            o["learnable_sink"], False, direct)


def counted(entry, taken: list):
    """entry (a fast-path entry of _C) that appends (direct, taken) to taken per call."""
    def call(*a):
        result = entry(*a)
        taken.append((a[-1], result is not None))
        return result
    return call


# ---- flash_attn_func ------------------------------------------------------------------------

OPTIONS = [
    dict(),
    dict(causal=True),
    dict(window_size=(3, 1), softcap=4.0),
    dict(softmax_scale=0.25, alibi_slopes="heads"),
    dict(alibi_slopes="batch_heads", causal=True),
    dict(learnable_sink=True),
    dict(window_size=[2, 0], softmax_scale=1),  # a list and an int: as float()/int() read them
]


@pytest.mark.parametrize("opt", OPTIONS, ids=lambda o: "-".join(o) or "plain")
@pytest.mark.parametrize("sq", [1, 5])
def test_func_takes_common_calls_and_matches_the_dlpack_path(opt, sq, dlpack_only, monkeypatch):
    g = gen(1)
    q, k, v = decode_inputs(g, sq=sq)
    kw = dict(opt)
    if kw.get("alibi_slopes") == "heads":
        kw["alibi_slopes"] = torch.rand(8, generator=g)
    elif kw.get("alibi_slopes") == "batch_heads":
        kw["alibi_slopes"] = torch.rand(2, 8, generator=g)
    if kw.get("learnable_sink"):
        kw["learnable_sink"] = randn(8, g=g)
    assert fast_forward(q, k, v, **kw) is not None
    fast, slow = both_paths(
        lambda: flashattn.flash_attn_func(q, k, v, return_attn_probs=True, **kw), dlpack_only,
        monkeypatch)
    assert_same(fast, slow)
    assert fast[0].shape == q.shape and fast[1].shape == (2, 8, sq)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_func_16_bit(dtype, dlpack_only, monkeypatch):
    q, k, v = decode_inputs(gen(2), sq=3, dtype=dtype)
    assert fast_forward(q, k, v) is not None
    assert_same(*both_paths(lambda: flashattn.flash_attn_func(q, k, v, causal=True), dlpack_only,
                            monkeypatch))


def declined_calls(g):
    """(name, q, k, v, keywords) of calls the fast path must decline (None), each then handled
    by the DLPack path."""
    q, k, v = decode_inputs(g, sq=3)
    d = q.shape[-1]
    strided_last = randn(2, 3, 8, 2 * d, g=g)[..., ::2]
    return [
        ("last dim strided (copied)", strided_last, k, v, {}),
        ("float64 q (TypeError)", q.double(), k, v, {}),
        ("q of rank 3", q[0], k, v, {}),
        ("bfloat16 sink (cast)", q, k, v, dict(learnable_sink=randn(8, g=g).bfloat16())),
        ("strided sink (copied)", q, k, v, dict(learnable_sink=randn(16, g=g)[::2])),
        ("numpy scale", q, k, v, dict(softmax_scale=np.float32(0.5))),
        ("zero scale (ValueError)", q, k, v, dict(softmax_scale=0.0)),
        ("window of numpy ints", q, k, v, dict(window_size=(np.int64(2), np.int64(0)))),
        ("window beyond int32", q, k, v, dict(window_size=(1 << 40, 0))),
        ("window not a pair", q, k, v, dict(window_size=(1, 2, 3))),
        ("numpy q", q.numpy(), k.numpy(), v.numpy(), {}),
        ("meta tensors", q.to("meta"), k.to("meta"), v.to("meta"), {}),
    ]


def test_func_declines_what_the_dlpack_path_converts_or_rejects(dlpack_only, monkeypatch):
    for name, q, k, v, kw in declined_calls(gen(3)):
        assert fast_forward(q, k, v, **kw) is None, name
        fast, slow = both_paths(lambda: outcome(lambda: flashattn.flash_attn_func(q, k, v, **kw)),
                                dlpack_only, monkeypatch)
        if name.startswith("numpy"):
            np.testing.assert_array_equal(fast, slow)
        elif name.startswith("meta"):
            assert fast.device.type == slow.device.type == "meta"
        else:
            assert_same(fast, slow)


def test_direct_calls_leave_dropout_and_autograd_to_python():
    q, k, v = decode_inputs(gen(4))
    assert fast_forward(q, k, v, dropout_p=0.1) is None  # the seed is drawn in Python
    q.requires_grad_()
    # A call that records a graph is taken, but run by FuncAutograd (which draws the seed).
    assert fast_forward(q, k, v) is True
    assert fast_forward(q, k, v, dropout_p=0.1) is True
    with torch.no_grad():
        assert isinstance(fast_forward(q, k, v), tuple)
    assert isinstance(fast_forward(q, k, v, direct=False), tuple)  # inside: no such checks
    kv = kvcache_case(gen(4))
    kv[0].requires_grad_()
    assert _C.torch_forward_kvcache(kv[0], kv[1], kv[2], None, None, None, None, kv[5], None,
                                    None, None, None, None, False, (-1, -1), 0.0, True, 0, None,
                                    True) is None  # no backward: the op path raises or warns


def test_errors_name_the_argument_on_both_paths(dlpack_only, monkeypatch):
    g = gen(5)
    q, k, v = decode_inputs(g, sq=2)
    cases = [
        (q, k[..., :16], v),                    # head dims differ
        (q, k.half(), v),                       # dtypes differ
        (q, k, v[:, :7]),                       # seqlen_k differs
        (q[:, :, :7], k, v),                    # heads not a multiple of heads_k
    ]
    for q_, k_, v_ in cases:
        fast, slow = both_paths(lambda: outcome(lambda: flashattn.flash_attn_func(q_, k_, v_)),
                                dlpack_only, monkeypatch)
        assert isinstance(fast, tuple) and issubclass(fast[0], Exception), fast
        assert fast == slow
    fast, _ = both_paths(lambda: outcome(
        lambda: flashattn.flash_attn_func(q, k, v, alibi_slopes=torch.rand(3, generator=g))),
        dlpack_only, monkeypatch)
    assert fast[0] is ValueError and "alibi_slopes" in fast[1]


def test_autograd_call_runs_the_fast_path_in_func_autograd(monkeypatch, dlpack_only):
    g = gen(6)
    q, k, v = (t.requires_grad_() for t in decode_inputs(g, sq=4))
    dout = randn(2, 4, 8, 32, g=g)
    calls = []
    real = _C.torch_forward

    def recorded(*a):
        result = real(*a)
        calls.append((a[-1], result if result is True or result is None else "ran"))
        return result

    def grads():
        for t in (q, k, v):
            t.grad = None
        out = flashattn.flash_attn_func(q, k, v, causal=True)
        out.backward(dout)
        return (out.detach(), q.grad, k.grad, v.grad)

    with monkeypatch.context() as m:
        m.setattr(_C, "torch_forward", recorded)
        fast = grads()
    # Direct: taken, to be recorded by FuncAutograd, whose forward then runs it.
    assert calls == [(True, True), (False, "ran")]
    assert _torch_ops.last_route == {"forward": "fast_autograd", "backward": "fast"}
    with monkeypatch.context() as m:
        dlpack_only(m)
        slow = grads()
    assert_same(fast, slow)


def test_packed_and_varlen_ops_take_the_fast_path(monkeypatch, dlpack_only):
    g = gen(7)
    qkv = randn(2, 9, 3, 4, 16, g=g)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    q, k, v = randn(12, 4, 16, g=g), randn(12, 2, 16, g=g), randn(12, 2, 16, g=g)
    taken = []
    monkeypatch.setattr(_C, "torch_forward", counted(_C.torch_forward, taken))
    calls = [
        lambda: flashattn.flash_attn_qkvpacked_func(qkv, causal=True),
        lambda: flashattn.flash_attn_kvpacked_func(qkv[:, :, 0], qkv[:, :, 1:], causal=True),
        lambda: flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 7, 7, causal=True,
                                                 return_attn_probs=True),
    ]
    for call in calls:
        taken.clear()
        fast = call()
        assert taken == [(False, True)], taken  # call_forward's direct call of the op's code
        with monkeypatch.context() as m:
            dlpack_only(m)
            slow = call()
        assert_same(fast, slow)


def test_backward_of_every_layout_takes_the_fast_path(monkeypatch, dlpack_only):
    """The op's backward implementation (_run_bwd) calls _C.torch_backward for the packed and
    varlen layouts too (gradients written into the packed gradient's views); gradients equal
    the DLPack path's bitwise."""
    g = gen(11)
    qkv0 = randn(2, 9, 3, 4, 16, g=g)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    q0, k0, v0 = randn(12, 4, 16, g=g), randn(12, 2, 16, g=g), randn(12, 2, 16, g=g)
    sink0 = randn(4, g=g)
    taken = []
    counted_backward = counted(_C.torch_backward, taken)

    def packed():
        qkv = qkv0.clone().requires_grad_()
        out = flashattn.flash_attn_qkvpacked_func(qkv, causal=True)
        out.backward(torch.ones_like(out) * 0.5)
        return out.detach(), qkv.grad

    def kvpacked():
        q, kv = qkv0[:, :, 0].clone().requires_grad_(), qkv0[:, :, 1:].clone().requires_grad_()
        sink = torch.nn.Parameter(sink0.clone())
        out = flashattn.flash_attn_kvpacked_func(q, kv, learnable_sink=sink, window_size=(3, 0))
        out.backward(torch.ones_like(out) * 0.5)
        return out.detach(), q.grad, kv.grad, sink.grad

    def varlen():
        q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
        out = flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 7, 7, causal=True)
        out.backward(torch.ones_like(out) * 0.5)
        return out.detach(), q.grad, k.grad, v.grad

    for call in (packed, kvpacked, varlen):
        taken.clear()
        with monkeypatch.context() as m:
            m.setattr(_C, "torch_backward", counted_backward)
            fast = call()
        assert taken == [(False, True)], (call.__name__, taken)
        with monkeypatch.context() as m:
            dlpack_only(m)
            slow = call()
        assert_same(fast, slow)


# ---- flash_attn_with_kvcache ----------------------------------------------------------------

def kvcache_case(g, paged=False, dtype=torch.float32):
    b, h, hk, d, cap = 2, 8, 2, 32, 40
    q = randn(b, 1, h, d, g=g, dtype=dtype)
    if paged:
        page = 8
        k_cache = randn(b * cap // page, page, hk, d, g=g, dtype=dtype)
        table = torch.randperm(b * cap // page, generator=g).to(torch.int32).view(b, -1)
    else:
        k_cache, table = randn(b, cap, hk, d, g=g, dtype=dtype), None
    v_cache = randn(*k_cache.shape, g=g, dtype=dtype)
    k_new, v_new = randn(b, 1, hk, d, g=g, dtype=dtype), randn(b, 1, hk, d, g=g, dtype=dtype)
    seqlens = torch.tensor([17, 30], dtype=torch.int32)
    return q, k_cache, v_cache, k_new, v_new, seqlens, table


@pytest.mark.parametrize("variant", ["read", "append", "paged", "rotary", "options", "int_seqlens",
                                     "bfloat16"])
def test_kvcache_fast_path_matches_the_dlpack_path(variant, dlpack_only, monkeypatch):
    g = gen(8)
    dtype = torch.bfloat16 if variant == "bfloat16" else torch.float32
    q, k_cache, v_cache, k_new, v_new, seqlens, table = kvcache_case(
        g, paged=variant == "paged", dtype=dtype)
    kw = dict(cache_seqlens=seqlens, return_softmax_lse=True)
    if variant != "read":
        kw.update(k=k_new, v=v_new)
    if variant == "paged":
        kw["block_table"] = table
    if variant == "rotary":
        kw.update(rotary_cos=randn(64, 8, g=g), rotary_sin=randn(64, 8, g=g), causal=True,
                  rotary_interleaved=False)
    if variant == "options":
        kw.update(causal=True, window_size=(9, 0), softcap=3.0, softmax_scale=0.2, num_splits=1,
                  alibi_slopes=torch.rand(8, generator=g), learnable_sink=randn(8, g=g))
    if variant == "int_seqlens":
        kw["cache_seqlens"] = 21

    def call():
        kc, vc = k_cache.clone(), v_cache.clone()
        out, lse = flashattn.flash_attn_with_kvcache(q, kc, vc, **kw)
        return out, lse, kc, vc

    seq = kw["cache_seqlens"]
    seq = seq if isinstance(seq, torch.Tensor) else torch.full((2,), seq, dtype=torch.int32)
    assert _C.torch_forward_kvcache(
        q, k_cache.clone(), v_cache.clone(), kw.get("k"), kw.get("v"), kw.get("rotary_cos"),
        kw.get("rotary_sin"), seq, None, None, kw.get("block_table"), kw.get("alibi_slopes"),
        kw.get("softmax_scale"), kw.get("causal", False), kw.get("window_size", (-1, -1)),
        kw.get("softcap", 0.0), kw.get("rotary_interleaved", True), kw.get("num_splits", 0),
        kw.get("learnable_sink"), True) is not None
    assert_same(*both_paths(call, dlpack_only, monkeypatch))


def test_kvcache_declines_and_errors_as_the_dlpack_path(dlpack_only, monkeypatch):
    g = gen(9)
    q, k_cache, v_cache, k_new, v_new, seqlens, table = kvcache_case(g)
    calls = [
        dict(cache_seqlens=seqlens.long()),                  # int64 seqlens: TypeError
        dict(cache_seqlens=seqlens, k=k_new),                # k without v: ValueError
        dict(cache_seqlens=seqlens, num_splits=1 << 33),     # beyond int32: ValueError
        dict(cache_seqlens=seqlens, block_table=table, cache_batch_idx=seqlens),
        dict(cache_seqlens=seqlens, learnable_sink=randn(8, g=g).half()),  # cast to float32
        dict(cache_seqlens=seqlens, k=randn(2, 1, 2, 64, g=g)[..., ::2], v=v_new),  # copied
    ]
    for kw in calls:
        def call():
            kc, vc = k_cache.clone(), v_cache.clone()
            r = outcome(lambda: flashattn.flash_attn_with_kvcache(q, kc, vc, **kw))
            return r if isinstance(r, tuple) and isinstance(r[0], type) else (r, kc, vc)
        assert_same(*both_paths(call, dlpack_only, monkeypatch))


def test_kvcache_op_implementation_takes_the_fast_path(monkeypatch):
    g = gen(10)
    q, k_cache, v_cache, k_new, v_new, seqlens, _ = kvcache_case(g)
    taken = []
    monkeypatch.setattr(_C, "torch_forward_kvcache", counted(_C.torch_forward_kvcache, taken))
    args = (q, k_cache.clone(), v_cache.clone(), k_new, v_new, None, None, seqlens, None, None,
            None, None, 0.0, False, -1, -1, 0.0, True, 0, None)
    out, lse = torch.ops.flashattn.fwd_kvcache(*args)
    assert taken == [(False, True)]  # direct=False, and taken
    ref_out, ref_lse = _torch_ops._IMPLS[_torch_ops.fwd_kvcache](
        q, k_cache.clone(), v_cache.clone(), *args[3:])
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


# ---- CUDA (skipped without a GPU) -------------------------------------------------------------

def _cuda_ready() -> bool:
    return flashattn.cuda_built() and flashattn.cuda_available() and torch.cuda.is_available()


cuda = pytest.mark.skipif(not _cuda_ready(), reason="no CUDA build, GPU or CUDA torch")


def cuda_decode(g, sk=300, dtype=torch.bfloat16):
    dev = torch.device("cuda", torch.cuda.current_device())
    r = lambda *s: torch.randn(*s, generator=g).to(dev, dtype)  # noqa: E731
    return r(1, 1, 32, 128), r(1, sk, 8, 128), r(1, sk, 8, 128), r(1, 1, 8, 128), r(1, 1, 8, 128)


@cuda
def test_cuda_fast_path_matches_the_dlpack_path(dlpack_only, monkeypatch):
    q, kc, vc, kn, vn = cuda_decode(gen(20))
    seqlens = torch.tensor([200], dtype=torch.int32, device=q.device)
    assert fast_forward(q, kc, vc) is not None

    def calls():
        k2, v2 = kc.clone(), vc.clone()
        out, lse, _ = flashattn.flash_attn_func(q, kc, vc, causal=True, return_attn_probs=True)
        kv_out, kv_lse = flashattn.flash_attn_with_kvcache(q, k2, v2, kn, vn, cache_seqlens=seqlens,
                                                           return_softmax_lse=True)
        return out, lse, kv_out, kv_lse, k2, v2

    fast, slow = both_paths(calls, dlpack_only, monkeypatch)
    assert_same(fast, slow)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the current stream, not the default one
        on_side = calls()
    side.synchronize()
    assert_same(on_side, fast)


@cuda
def test_cuda_fast_path_declines_misaligned_operands(dlpack_only, monkeypatch):
    q, kc, vc, _, _ = cuda_decode(gen(21))
    shifted = torch.empty(q.numel() + 1, dtype=q.dtype, device=q.device)[1:].view(q.shape)
    shifted.copy_(q)  # data_ptr % 16 == 2: _kernel_ready copies it
    assert fast_forward(shifted, kc, vc) is None
    assert_same(*both_paths(lambda: flashattn.flash_attn_func(shifted, kc, vc), dlpack_only,
                            monkeypatch))


@cuda
def test_cuda_graph_replays_the_fast_path_kvcache_step():
    q, kc, vc, kn, vn = cuda_decode(gen(22))
    seqlens = torch.tensor([100], dtype=torch.int32, device=q.device)

    def step():
        return flashattn.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=seqlens)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        eager = step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    q.copy_(torch.randn(q.shape, generator=gen(23)).to(q))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, step()) and not torch.equal(captured, eager)


@cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_cuda_fast_path_declines_a_gpu_that_is_not_current(dlpack_only, monkeypatch):
    with torch.cuda.device(1):
        q, kc, vc, _, _ = cuda_decode(gen(24))
    assert torch.cuda.current_device() != 1
    assert fast_forward(q, kc, vc) is None
    fast, slow = both_paths(lambda: flashattn.flash_attn_func(q, kc, vc), dlpack_only, monkeypatch)
    assert fast.device == q.device
    assert_same(fast, slow)


@cuda
def test_cuda_training_call_takes_the_fast_route(monkeypatch):
    """On a GPU the backward runs on the autograd engine's device thread: the training call's
    route there (FuncAutograd's forward, _C.torch_backward) and its gradients, bitwise the op
    route's."""
    q0, k0, v0, _, _ = cuda_decode(gen(25), sk=64)
    dout = torch.randn(q0.shape, generator=gen(26)).to(q0)

    def run():
        q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
        # deterministic: a fixed dQ reduction order, so two runs can agree bitwise
        out = flashattn.flash_attn_func(q, k, v, causal=True, deterministic=True)
        out.backward(dout)
        return out.detach(), q.grad, k.grad, v.grad

    fast = run()
    torch.cuda.synchronize()
    assert _torch_ops.last_route == {"forward": "fast_autograd", "backward": "fast"}
    real = _C.torch_forward
    monkeypatch.setattr(_C, "torch_forward", lambda *a: None if real(*a) is True else real(*a))
    monkeypatch.setattr(_torch_ops, "_EAGER_AUTOGRAD", {})
    assert_same(fast, run())
    assert _torch_ops.last_route == {"forward": "op", "backward": "op"}


# ---- training calls without the custom op's wrapper -------------------------------------------

# extras -> the forward route of a training call with them (_torch_ops.last_route).
TRAINING_ROUTES = {
    "plain": "fast_autograd",
    "sink_dropout": "fast_autograd",
    "alibi_window_softcap_deterministic": "fast_autograd",
    "summed_dout": "fast_autograd",  # dout expanded from a sum: the backward goes to the op's code
    "sink_bias_dropout": "eager_autograd",
    "packed": "eager_autograd",
}


def test_route_queries_are_torchs_own():
    """_route's queries are torch's functions under the torch installed: a missing one (the
    functorch query's fallback answers True) would send every call to the op, silently."""
    assert _torch_ops._functorch_active is torch._C._are_functorch_transforms_active
    assert _torch_ops._dispatch_depth is torch._C._len_torch_dispatch_stack
    assert _torch_ops._mode_enabled is torch._C._is_torch_function_mode_enabled


@pytest.mark.parametrize("extras", list(TRAINING_ROUTES))
def test_training_call_takes_the_fast_route_and_matches_the_op_route(extras, monkeypatch):
    """A call that records a graph (inputs require grad, grad enabled) skips the custom op's
    autograd wrapper: flash_attn_func without bias, masks or FP8 runs FuncAutograd (the
    extension's torch entries forward and backward), the other calls the op's autograd formula
    as an autograd.Function (EagerAutograd). Values and every gradient equal the op route's
    (and EagerAutograd's) bitwise."""
    g = gen(30)
    q0, k0, v0 = decode_inputs(g, sq=6, sk=11)
    dout = randn(2, 6, 8, 32, g=g)
    sink0 = randn(8, g=g)
    bias0 = randn(1, 8, 6, 11, g=g)

    def run():
        torch.manual_seed(7)  # the dropout seed
        if extras == "packed":
            qkv = torch.stack([q0, q0.flip(1), q0.flip(2)], dim=2).requires_grad_()
            out = flashattn.flash_attn_qkvpacked_func(qkv, causal=True)
            out.backward(dout)
            return out.detach(), qkv.grad
        q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
        kw = dict(causal=True)
        if extras.startswith("sink"):
            kw.update(learnable_sink=torch.nn.Parameter(sink0.clone()), dropout_p=0.2)
        if extras == "sink_bias_dropout":
            kw["attn_bias"] = bias0.clone().requires_grad_()
        if extras.startswith("alibi"):
            kw.update(alibi_slopes=torch.rand(8, generator=gen(31)), window_size=[3, 1],
                      softcap=4.0, deterministic=True)
        out = flashattn.flash_attn_func(q, k, v, **kw)
        assert out.grad_fn is not None
        if extras == "summed_dout":
            out.sum().backward()  # dout: ones expanded, all strides 0
        else:
            out.backward(dout)
        grads = [q.grad, k.grad, v.grad]
        for name in ("learnable_sink", "attn_bias"):
            if name in kw:
                grads.append(kw[name].grad)
                assert grads[-1] is not None
        return (out.detach(), *grads)

    fast = run()
    route = TRAINING_ROUTES[extras]
    backward = "fast" if route == "fast_autograd" and extras != "summed_dout" else "direct"
    assert _torch_ops.last_route == {"forward": route, "backward": backward}
    real = _C.torch_forward
    # The direct call's True (a graph to record) read as a refusal: EagerAutograd's route.
    monkeypatch.setattr(_C, "torch_forward", lambda *a: None if real(*a) is True else real(*a))
    if route == "fast_autograd":
        assert_same(fast, run())
        assert _torch_ops.last_route == {"forward": "eager_autograd", "backward": "direct"}
    monkeypatch.setattr(_torch_ops, "_EAGER_AUTOGRAD", {})
    assert_same(fast, run())
    assert _torch_ops.last_route == {"forward": "op", "backward": "op"}


def test_training_call_records_only_what_it_returns(monkeypatch):
    """FuncAutograd's node: out its only output without return_attn_probs; with it, lse too,
    not differentiable. Its backward is handed no materialised dlse (set_materialize_grads
    False: autograd would otherwise allocate and zero-fill one per backward, a fill kernel on a
    GPU), and values and gradients equal the op route's bitwise either way."""
    g = gen(40)
    q0, k0, v0 = decode_inputs(g, sq=5, sk=9)
    dout = randn(2, 5, 8, 32, g=g)
    seen = []
    real_backward = _torch_ops.FuncAutograd.backward

    def spy(ctx, *grads):
        seen.append(tuple(x is None for x in grads))
        return real_backward(ctx, *grads)

    def run(probs):
        q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
        result = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=probs)
        out, lse = (result[0], result[1]) if probs else (result, None)
        if probs:
            assert result[2] is None and not lse.requires_grad and lse.grad_fn is None
        out.backward(dout)
        return out.detach(), lse, q.grad, k.grad, v.grad

    with monkeypatch.context() as m:
        m.setattr(_torch_ops.FuncAutograd, "backward", staticmethod(spy))
        fast = [run(False), run(True)]
        assert _torch_ops.last_route == {"forward": "fast_autograd", "backward": "fast"}
    assert seen == [(False,), (False, True)]
    assert fast[1][1].shape == (2, 8, 5)
    assert_same(fast[0][::2], fast[1][::2])
    # No gradient reached out: none for any input.
    assert _torch_ops.FuncAutograd.backward(None, None) == (None,) * 13
    real = _C.torch_forward
    monkeypatch.setattr(_C, "torch_forward", lambda *a: None if real(*a) is True else real(*a))
    monkeypatch.setattr(_torch_ops, "_EAGER_AUTOGRAD", {})
    for probs, result in zip((False, True), fast):
        assert_same(result, run(probs))
        assert _torch_ops.last_route == {"forward": "op", "backward": "op"}


def test_training_call_under_checkpoint_and_saved_tensor_hooks():
    """FuncAutograd saves lse as an intermediate when it is not an output: non-reentrant
    activation checkpointing (which recomputes the forward and matches the saved tensors) and
    saved-tensor hooks see it like the others, and the gradients are bitwise those of a plain
    call, with and without return_attn_probs."""
    from torch.utils.checkpoint import checkpoint

    g = gen(41)
    q0, k0, v0 = decode_inputs(g, sq=5, sk=7)
    dout = randn(2, 5, 8, 32, g=g)

    def run(wrap, probs):
        q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))

        def attend(a, b, c):
            result = flashattn.flash_attn_func(a, b, c, causal=True, return_attn_probs=probs)
            return (result[0] if probs else result) * 2

        wrap(attend, q, k, v).backward(dout)
        assert _torch_ops.last_route == {"forward": "fast_autograd", "backward": "fast"}
        return q.grad, k.grad, v.grad

    def on_cpu(fn, *args):
        with torch.autograd.graph.save_on_cpu():
            return fn(*args)

    for probs in (False, True):
        plain = run(lambda fn, *a: fn(*a), probs)
        assert_same(plain, run(lambda fn, *a: checkpoint(fn, *a, use_reentrant=False), probs))
        assert_same(plain, run(on_cpu, probs))


def test_training_call_under_a_mode_or_transform_takes_the_op():
    """What needs the registered op sees it in a training call too: a dispatch mode (forward
    and backward), torch.func.grad, and a torch function mode."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.overrides import TorchFunctionMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    class Passing(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    q, k, v = (t.requires_grad_() for t in decode_inputs(gen(32), sq=4))
    dout = torch.ones(2, 4, 8, 32)
    with Seen() as mode:
        flashattn.flash_attn_func(q, k, v, causal=True).backward(dout)
    assert _torch_ops.last_route == {"forward": "op", "backward": "op"}
    assert any("flashattn.fwd" in op for op in mode.ops)
    assert any("flashattn.bwd" in op for op in mode.ops)
    with Passing():
        flashattn.flash_attn_func(q, k, v, causal=True).backward(dout)
    assert _torch_ops.last_route["forward"] == "op"

    def loss(q_):
        return flashattn.flash_attn_func(q_, k.detach(), v.detach(), causal=True).sum()

    _torch_ops.last_route["forward"] = None
    try:
        torch.func.grad(loss)(q.detach())
    except RuntimeError as e:  # torch's own wrapper of the op (2.15) refuses the transform
        assert "functorch transforms" in str(e)
    assert _torch_ops.last_route["forward"] == "op"


def test_host_time_bench_reports_the_training_route_on_the_cpu(tmp_path, monkeypatch):
    """bench/host_time.py on the CPU device, a few calls: the JSON names the training call's
    route and holds host_us per row and the requested profile."""
    import importlib.util
    import os
    import sys

    bench_dir = os.path.join(os.path.dirname(__file__), "..", "..", "bench")
    monkeypatch.setattr(sys, "path", [bench_dir] + sys.path)
    spec = importlib.util.spec_from_file_location("fa_host_time",
                                                  os.path.join(bench_dir, "host_time.py"))
    host_time = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(host_time)
    report = host_time.main(["--device", "cpu", "--cache-lens", "8", "--calls", "3",
                             "--rounds", "1", "--warmup", "1", "--host-calls", "2",
                             "--host-rounds", "2", "--profile", "flash_attn_func_train",
                             "--out", str(tmp_path / "host.json")])
    run = report["by_cache_len"]["8"]
    assert run["fast_path"]["train_route"] == {"forward": "fast_autograd", "backward": "fast"}
    assert run["fast_path"]["c_torch_backward"] is True
    for row in ("flash_attn_func_train", "flash_attn_func_train_fwd", "c_torch_backward",
                "function_floor_train"):
        assert run["results"][row]["host_median_us"] > 0, row
        assert len(run["results"][row]["host_us"]) == 2, row  # --host-rounds 2, --rounds 1
        assert run["results"][row]["host_min_us"] <= run["results"][row]["host_median_us"]
    text = run["profiles"]["flash_attn_func_train"]
    assert "_torch_ops.py" in text and "(backward)" in text  # FuncAutograd.backward's line
