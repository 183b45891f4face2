"""Learnable attention sinks (``learnable_sink=``, issue 19) and head_dim_v != head_dim through
the Python package: numpy arrays on the CPU backend (forward through the flash_attn-style
functions, backward and dsink through the low-level API), torch autograd when torch is present,
and CUDA when a GPU is (skipped otherwise, with the reason)."""

import numpy as np
import pytest

import attn_ref
import flashattn

RNG = np.random.default_rng(20261201)

SHAPES = [
    dict(b=2, sq=17, sk=29, h=4, hk=2, d=32, dv=32),
    dict(b=1, sq=1, sk=33, h=8, hk=2, d=16, dv=16),     # decode, GQA
    dict(b=2, sq=9, sk=5, h=4, hk=4, d=8, dv=8),        # causal: empty rows see only the sink
    dict(b=1, sq=13, sk=21, h=3, hk=1, d=40, dv=24),    # head_dim_v != head_dim
]
OPTIONS = [
    dict(),
    dict(causal=True),
    dict(window=(3, 2)),
    dict(softcap=5.0, causal=True),
    dict(alibi="heads"),
    dict(scale=0.3, window=(4, 0)),
]
SINKS = ["random", "large", "huge"]


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def make_inputs(s, dtype=np.float32):
    return (randn(s["b"], s["sq"], s["h"], s["d"], dtype=dtype),
            randn(s["b"], s["sk"], s["hk"], s["d"], dtype=dtype),
            randn(s["b"], s["sk"], s["hk"], s["dv"], dtype=dtype))


def make_sink(kind, h):
    if kind == "random":
        sink = RNG.normal(0.5, 1.5, size=h)
        if h >= 3:
            sink[1] = -np.inf
    elif kind == "large":
        sink = RNG.uniform(4, 8, size=h)
    else:
        sink = RNG.uniform(100, 110, size=h)  # exp(sink - score) overflows float32
    return sink.astype(np.float32)


def kwargs(opt, h):
    alibi = None
    if opt.get("alibi"):
        alibi = RNG.uniform(0.05, 0.5, size=h).astype(np.float32)
    call = dict(causal=opt.get("causal", False), window_size=opt.get("window", (-1, -1)),
                softcap=opt.get("softcap", 0.0), softmax_scale=opt.get("scale"), alibi_slopes=alibi)
    ref = dict(causal=opt.get("causal", False), window=opt.get("window", (-1, -1)),
               softcap=opt.get("softcap", 0.0), scale=opt.get("scale"), alibi=alibi)
    return call, ref


def lowlevel(q, k, v, dout, sink, **kw):
    out = np.empty(q.shape[:-1] + v.shape[-1:], dtype=q.dtype)
    lse = np.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=np.float32)
    flashattn.forward(q, k, v, out, lse, learnable_sink=sink, **kw)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    dsink = np.empty(q.shape[2], dtype=np.float32) if sink is not None else None
    flashattn.backward(dout, q, k, v, out, lse, dq, dk, dv, learnable_sink=sink, dsink=dsink, **kw)
    return out, lse, dq, dk, dv, dsink


@pytest.mark.parametrize("sink_kind", SINKS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{b}_sq{sq}_sk{sk}_h{h}_hk{hk}_d{d}_dv{dv}".format(**s))
@pytest.mark.parametrize("opt", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()) or "plain")
def test_forward_and_backward_match_reference(shape, opt, sink_kind):
    q, k, v = make_inputs(shape)
    dout = randn(shape["b"], shape["sq"], shape["h"], shape["dv"])
    sink = make_sink(sink_kind, shape["h"])
    call, ref = kwargs(opt, shape["h"])
    out, lse, s_dmask = flashattn.flash_attn_func(q, k, v, return_attn_probs=True,
                                                  learnable_sink=sink, **call)
    assert s_dmask is None and out.shape == q.shape[:-1] + (shape["dv"],)
    r_out, r_lse = attn_ref.forward(q, k, v, sink=sink, **ref)
    l_out, l_lse = attn_ref.forward(q, k, v, sink=sink, dtype=np.float32, **ref)
    attn_ref.assert_fa_close("out", out, r_out, l_out, 1e-5)
    attn_ref.assert_fa_close("lse", lse, r_lse, l_lse, 1e-5)

    _, _, dq, dk, dv, dsink = lowlevel(q, k, v, dout, sink, **call)
    r = attn_ref.backward(dout, q, k, v, sink=sink, **ref)
    lo = attn_ref.backward(dout, q, k, v, sink=sink, dtype=np.float32, **ref)
    for name, ours, a, b in zip(("dq", "dk", "dv", "dsink"), (dq, dk, dv, dsink), r, lo):
        attn_ref.assert_fa_close(name, ours, a, b, 1e-4)


def test_empty_rows_see_only_the_sink():
    s = dict(b=1, sq=7, sk=3, h=2, hk=2, d=16, dv=8)
    q, k, v = make_inputs(s)
    sink = np.array([0.25, -1.5], dtype=np.float32)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, learnable_sink=sink,
                                            return_attn_probs=True)
    assert np.all(out[:, :4] == 0)
    np.testing.assert_allclose(lse[0, :, :4], np.repeat(sink[:, None], 4, axis=1), rtol=1e-6)


def test_no_keys_at_all_lse_is_the_sink():
    """seqlen_k = 0: every row sees only its head's sink (out 0, LSE = sink), not -inf."""
    s = dict(b=2, sq=5, sk=0, h=3, hk=3, d=16, dv=16)
    q, k, v = make_inputs(s)
    sink = np.array([0.25, -1.5, 3.0], dtype=np.float32)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, learnable_sink=sink, return_attn_probs=True)
    assert np.all(out == 0)
    np.testing.assert_array_equal(lse, np.broadcast_to(sink[None, :, None], lse.shape))


def test_cuda_no_keys_at_all_lse_is_the_sink():
    torch = _cuda()
    q = torch.randn(2, 5, 3, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 0, 3, 64, device="cuda", dtype=torch.bfloat16)
    sink = torch.tensor([0.25, -1.5, 3.0], device="cuda")
    out, lse, _ = flashattn.flash_attn_func(q, k, k, learnable_sink=sink, return_attn_probs=True)
    assert torch.all(out == 0)
    assert torch.equal(lse, sink[None, :, None].expand_as(lse))


def test_neg_inf_sink_is_bitwise_no_sink():
    s = SHAPES[0]
    q, k, v = make_inputs(s)
    dout = randn(s["b"], s["sq"], s["h"], s["dv"])
    none = lowlevel(q, k, v, dout, None, causal=True)
    neg = lowlevel(q, k, v, dout, np.full(s["h"], -np.inf, dtype=np.float32), causal=True)
    for a, b in zip(none[:5], neg[:5]):
        assert np.array_equal(a, b)
    assert np.all(neg[5] == 0)


def test_varlen_with_sink_matches_per_sequence():
    lens_q, lens_k = [5, 1, 17, 0, 9], [7, 4, 17, 3, 2]
    h, hk, d, dv = 4, 2, 16, 8
    sink = make_sink("random", h)
    qs = [randn(1, n, h, d) for n in lens_q]
    ks = [randn(1, n, hk, d) for n in lens_k]
    vs = [randn(1, n, hk, dv) for n in lens_k]
    pack = lambda ts: np.concatenate([t[0] for t in ts], axis=0)  # noqa: E731
    cu = lambda lens: np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)  # noqa: E731
    out, lse, _ = flashattn.flash_attn_varlen_func(
        pack(qs), pack(ks), pack(vs), cu(lens_q), cu(lens_k), max(lens_q), max(lens_k),
        causal=True, learnable_sink=sink, return_attn_probs=True)
    cq = cu(lens_q)
    for i, n in enumerate(lens_q):
        if n == 0:
            continue
        o_i, l_i, _ = flashattn.flash_attn_func(qs[i], ks[i], vs[i], causal=True,
                                                learnable_sink=sink, return_attn_probs=True)
        np.testing.assert_allclose(out[cq[i]:cq[i + 1]], o_i[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(lse[:, cq[i]:cq[i + 1]], l_i[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("d, dv", [(192, 128), (576, 512), (64, 32), (40, 24)])
def test_head_dim_v_pairs(d, dv):
    s = dict(b=1, sq=3 if d == 576 else 19, sk=37, h=4, hk=1 if d == 576 else 2, d=d, dv=dv)
    q, k, v = make_inputs(s)
    dout = randn(s["b"], s["sq"], s["h"], dv)
    out, lse, dq, dk, dv_, _ = lowlevel(q, k, v, dout, None, causal=True)
    assert out.shape[-1] == dv and dv_.shape[-1] == dv
    r_out, r_lse = attn_ref.forward(q, k, v, causal=True)
    l_out, l_lse = attn_ref.forward(q, k, v, causal=True, dtype=np.float32)
    attn_ref.assert_fa_close("out", out, r_out, l_out, 1e-5)
    r = attn_ref.backward(dout, q, k, v, causal=True)
    lo = attn_ref.backward(dout, q, k, v, causal=True, dtype=np.float32)
    for name, ours, a, b in zip(("dq", "dk", "dv"), (dq, dk, dv_), r, lo):
        attn_ref.assert_fa_close(name, ours, a, b, 1e-4)


def test_bad_sink_arguments_are_named():
    q, k, v = make_inputs(SHAPES[0])
    with pytest.raises(ValueError, match="learnable_sink must have shape"):
        flashattn.flash_attn_func(q, k, v, learnable_sink=np.zeros(3, dtype=np.float32))
    with pytest.raises(TypeError, match="learnable_sink must have dtype float32"):
        flashattn.flash_attn_func(q, k, v, learnable_sink=np.zeros(4, dtype=np.float16))
    out = np.empty_like(q)
    lse = np.empty((2, 4, 17), dtype=np.float32)
    flashattn.forward(q, k, v, out, lse)
    grads = [np.empty_like(t) for t in (q, k, v)]
    with pytest.raises(ValueError, match="dsink .* without learnable_sink"):
        flashattn.backward(q, q, k, v, out, lse, *grads, dsink=np.empty(4, dtype=np.float32))


# ---- torch ----------------------------------------------------------------------------------

def _torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("fn", ["func", "qkvpacked", "kvpacked", "varlen"])
def test_torch_autograd_returns_the_sink_gradient(fn):
    torch = _torch()
    b, s, h, d = 2, 13, 4, 16
    g = torch.Generator().manual_seed(5)
    q, k, v, dout = (torch.randn(b, s, h, d, generator=g) for _ in range(4))
    sink = torch.tensor(make_sink("random", h)).requires_grad_()
    qkv = torch.stack([q, k, v], dim=2).requires_grad_()
    if fn == "func":
        out = flashattn.flash_attn_func(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True,
                                        learnable_sink=sink)
    elif fn == "qkvpacked":
        out = flashattn.flash_attn_qkvpacked_func(qkv, causal=True, learnable_sink=sink)
    elif fn == "kvpacked":
        out = flashattn.flash_attn_kvpacked_func(qkv[:, :, 0], qkv[:, :, 1:], causal=True,
                                                 learnable_sink=sink)
    else:
        cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32)
        flat = qkv.reshape(b * s, 3, h, d)
        out = flashattn.flash_attn_varlen_func(flat[:, 0], flat[:, 1], flat[:, 2], cu, cu, s, s,
                                               causal=True, learnable_sink=sink).reshape(b, s, h, d)
    (out * dout).sum().backward()
    args = [t.detach().numpy() for t in (q, k, v)]
    ref = attn_ref.backward(dout.numpy(), *args, causal=True, sink=sink.detach().numpy())
    low = attn_ref.backward(dout.numpy(), *args, causal=True, sink=sink.detach().numpy(),
                            dtype=np.float32)
    attn_ref.assert_fa_close("dsink", sink.grad.numpy(), ref[3], low[3], 1e-4)
    for i, name in enumerate(("dq", "dk", "dv")):
        attn_ref.assert_fa_close(name, qkv.grad[:, :, i].numpy(), ref[i], low[i], 1e-4)


def test_torch_bfloat16_sink_parameter_gets_a_gradient():
    torch = _torch()
    q, k, v = (torch.randn(1, 9, 2, 8) for _ in range(3))
    sink = torch.zeros(2, dtype=torch.bfloat16, requires_grad=True)
    flashattn.flash_attn_func(q, k, v, learnable_sink=sink).sum().backward()
    assert sink.grad is not None and sink.grad.dtype == torch.bfloat16


@pytest.mark.parametrize("layout", ["", "_qkvpacked", "_kvpacked"])
def test_torch_ops_with_a_sink_pass_opcheck(layout):
    """The custom ops' schemas, fake kernels and autograd with learnable_sink given (the last,
    defaulted input) and the backward ops' dsink output."""
    torch = _torch()
    g = torch.Generator().manual_seed(11)
    b, s, h, hk, d = 2, 9, 4, 2, 16
    sink = torch.tensor(make_sink("random", h)).requires_grad_()
    opts = (None, 0.0, True, -1, -1, 0.0, 0.0, None, False, sink)
    ops = torch.ops.flashattn
    if layout == "":
        q, k, v = (torch.randn(b, s, n, d, generator=g).requires_grad_() for n in (h, hk, hk))
        op, args = ops.fwd.default, (q, k, v, None, None, 0, 0) + opts
    elif layout == "_qkvpacked":
        qkv = torch.randn(b, s, 3, h, d, generator=g).requires_grad_()
        op, args = ops.fwd_qkvpacked.default, (qkv, None, 0) + opts
    else:
        q = torch.randn(b, s, h, d, generator=g).requires_grad_()
        kv = torch.randn(b, s, 2, hk, d, generator=g).requires_grad_()
        op, args = ops.fwd_kvpacked.default, (q, kv, None, None, 0, 0) + opts
    torch.library.opcheck(op, args)
    detached = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
    out, lse = op(*detached)
    n = {"": 3, "_qkvpacked": 1, "_kvpacked": 2}[layout]
    bwd = getattr(ops, "bwd" + layout).default
    bwd_args = (torch.randn_like(out),) + detached[:n] + (out, lse) + detached[n:]
    torch.library.opcheck(bwd, bwd_args)
    grads = bwd(*bwd_args)  # the inputs' gradients, dsink, dbias (empty: no bias)
    assert len(grads) == n + 2 and grads[-2].shape == (h,) and grads[-2].dtype == torch.float32
    assert grads[-1].shape == (0,)
    no_sink = bwd(*bwd_args[:-1])
    assert len(no_sink) == n + 2 and no_sink[-2].shape == (0,)


# ---- CUDA -----------------------------------------------------------------------------------

def _cuda():
    torch = _torch()
    if not flashattn.cuda_built():
        pytest.skip("flashattn was built without the CUDA backend")
    if not (flashattn.cuda_available() and torch.cuda.is_available()):
        pytest.skip("no usable CUDA GPU for flashattn and torch")
    return torch


def _naive_sink(q, k, v, sink, causal):
    """Naive attention with the sink as a softmax column (torch, differentiable, in q's dtype)."""
    import torch
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    k = k.repeat_interleave(h // hk, dim=2)
    v = v.repeat_interleave(h // hk, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, k) * d ** -0.5
    mask = torch.from_numpy(attn_ref.visible(sq, sk, causal)).to(s.device)
    s = s.masked_fill(~mask, float("-inf"))
    col = sink.to(s.dtype)[None, :, None, None].expand(b, h, sq, 1)
    p = torch.softmax(torch.cat([s, col], dim=-1), dim=-1)[..., :-1]
    return torch.einsum("bhij,bjhd->bihd", p, v)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", [
    dict(b=2, sq=113, sk=203, h=6, hk=2, d=128, causal=True, splits=1),
    dict(b=2, sq=300, sk=450, h=8, hk=2, d=128, causal=True, splits=1),  # sm90: several tiles per CTA
    dict(b=2, sq=1, sk=300, h=8, hk=2, d=128, causal=False, splits=1),   # GQA decode fold
    dict(b=2, sq=1, sk=300, h=8, hk=2, d=128, causal=False, splits=3),   # + split-KV combine
    dict(b=1, sq=77, sk=500, h=4, hk=4, d=64, causal=True, splits=4),    # split-KV row tiles
], ids=lambda c: "sq{sq}_sk{sk}_h{h}_hk{hk}_d{d}_splits{splits}".format(**c))
def test_cuda_sink_matches_float64(case, dtype):
    torch = _cuda()
    import torch_ref
    dt = getattr(torch, dtype)
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(3)
    def r(*shape):
        return torch.randn(*shape, generator=g, device=dev, dtype=dt)
    q, k, v = r(case["b"], case["sq"], case["h"], case["d"]), r(case["b"], case["sk"], case["hk"], case["d"]), \
        r(case["b"], case["sk"], case["hk"], case["d"])
    dout = r(case["b"], case["sq"], case["h"], case["d"])
    sink = torch.tensor(make_sink("random", case["h"]), device=dev)
    causal = case["causal"]
    atol = 1e-3 if dtype == "bfloat16" else 2e-4

    # Values and gradients (dsink included) through autograd, against float64 and naive dtype.
    ours = torch_ref.values_and_grads(
        lambda q, k, v, s: flashattn.flash_attn_func(q, k, v, causal=causal, learnable_sink=s,
                                                     deterministic=True),
        [q, k, v, sink], dout)
    naive = lambda q, k, v, s: _naive_sink(q, k, v, s, causal)  # noqa: E731
    ref = torch_ref.values_and_grads(naive, [q.double(), k.double(), v.double(), sink.double()], dout)
    low = torch_ref.values_and_grads(naive, [q, k, v, sink], dout)
    for name, o, a, b in zip(["out", "dq", "dk", "dv", "dsink"], ours, ref, low):
        attn_ref.assert_fa_close(name, o, a, b, atol * (1 if name == "out" else 4))

    # The requested number of key splits (the combine adds the sink), through the low-level API.
    out = torch.empty_like(q)
    lse = torch.empty(case["b"], case["h"], case["sq"], device=dev, dtype=torch.float32)
    flashattn.forward(q, k, v, out, lse, causal=causal, num_splits=case["splits"],
                      learnable_sink=sink)
    attn_ref.assert_fa_close("out(splits)", torch_ref.to_numpy(out), ref[0], low[0], atol)
    r_out, r_lse = attn_ref.forward(*(torch_ref.to_numpy(t) for t in (q, k, v)), causal=causal,
                                    sink=sink.cpu().numpy())
    np.testing.assert_allclose(torch_ref.to_numpy(lse), r_lse, rtol=0, atol=1e-3)

    # dsink is reproducible bit for bit.
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dsinks = [torch.empty(case["h"], device=dev, dtype=torch.float32) for _ in range(2)]
    for ds in dsinks:
        flashattn.backward(dout, q, k, v, out, lse, dq, dk, dv, causal=causal,
                           learnable_sink=sink, dsink=ds)
    assert torch.equal(dsinks[0], dsinks[1])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("d, dv", [(192, 128), (128, 64), (64, 128)])
def test_cuda_head_dim_v_with_sink_matches_float64(d, dv, dtype):
    """head_dim_v != head_dim on CUDA (run at one built head dim on zero-padded copies of the
    narrow side) with a sink: values, gradients and dsink against float64."""
    torch = _cuda()
    import torch_ref
    dt = getattr(torch, dtype)
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(d + dv)
    b, sq, sk, h, hk = 2, 113, 203, 6, 2
    def r(*shape):
        return torch.randn(*shape, generator=g, device=dev, dtype=dt)
    q, k, v, dout = r(b, sq, h, d), r(b, sk, hk, d), r(b, sk, hk, dv), r(b, sq, h, dv)
    sink = torch.tensor(make_sink("random", h), device=dev)
    atol = 1e-3 if dtype == "bfloat16" else 2e-4
    ours = torch_ref.values_and_grads(
        lambda q, k, v, s: flashattn.flash_attn_func(q, k, v, causal=True, learnable_sink=s,
                                                     deterministic=True),
        [q, k, v, sink], dout)
    naive = lambda q, k, v, s: _naive_sink(q, k, v, s, True)  # noqa: E731
    ref = torch_ref.values_and_grads(naive, [q.double(), k.double(), v.double(), sink.double()], dout)
    low = torch_ref.values_and_grads(naive, [q, k, v, sink], dout)
    assert ours[0].shape == (b, sq, h, dv) and ours[3].shape == (b, sk, hk, dv)
    for name, o, a, lo in zip(["out", "dq", "dk", "dv", "dsink"], ours, ref, low):
        attn_ref.assert_fa_close(name, o, a, lo, atol * (1 if name == "out" else 4))


@pytest.mark.parametrize("d, dv, name", [(576, 512, "head_dim 576"), (128, 512, "head_dim_v 512")])
def test_cuda_head_dims_above_256_are_not_supported(d, dv, name):
    """MLA decode (576/512) exceeds the CUDA backend's 256 limit on either head dim: a clear
    NotImplementedError naming it (the CPU backend runs it)."""
    torch = _cuda()
    q = torch.randn(2, 1, 16, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 129, 1, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 129, 1, dv, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match=name + " is not supported by the CUDA backend"):
        flashattn.flash_attn_func(q, k, v)
