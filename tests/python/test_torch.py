"""torch integration on the CPU backend: values and gradients against a float64 reference,
layouts, dropout, custom-op registrations (opcheck), torch.compile(fullgraph=True), and a small
GPT block run through ``import flashattn as flash_attn``."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import attn_ref  # noqa: E402
import gpt_block  # noqa: E402
import flashattn  # noqa: E402
import torch_ref  # noqa: E402

ATOL = 1e-5
GRAD_ATOL = 1e-4

SHAPES = [
    dict(b=2, sq=17, sk=17, h=4, hk=4, d=32, dv=32),
    dict(b=1, sq=1, sk=33, h=2, hk=1, d=16, dv=16),
    dict(b=2, sq=9, sk=5, h=4, hk=2, d=8, dv=8),
    dict(b=2, sq=23, sk=41, h=6, hk=2, d=40, dv=24),
]
OPTIONS = [
    dict(),
    dict(causal=True),
    dict(window=(3, 2)),
    dict(softcap=5.0),
    dict(alibi="heads"),
    dict(alibi="batch_heads", causal=True),
    dict(scale=0.3, softcap=2.0, window=(4, 0)),
]


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def randn(*shape, g, dtype=torch.float32):
    return torch.randn(*shape, generator=g, dtype=dtype)


def make_inputs(s, g, dtype=torch.float32):
    return (randn(s["b"], s["sq"], s["h"], s["d"], g=g, dtype=dtype),
            randn(s["b"], s["sk"], s["hk"], s["d"], g=g, dtype=dtype),
            randn(s["b"], s["sk"], s["hk"], s["dv"], g=g, dtype=dtype))


def alibi_for(kind, b, h, g):
    if kind is None:
        return None
    shape = (h,) if kind == "heads" else (b, h)
    return torch.rand(*shape, generator=g) * 0.45 + 0.05


def fa_kwargs(opt, alibi):
    return dict(causal=opt.get("causal", False), window_size=opt.get("window", (-1, -1)),
                softcap=opt.get("softcap", 0.0), softmax_scale=opt.get("scale"),
                alibi_slopes=alibi)


def ref_kwargs(opt, alibi):
    return dict(causal=opt.get("causal", False), window=opt.get("window", (-1, -1)),
                softcap=opt.get("softcap", 0.0), scale=opt.get("scale"), alibi=alibi)


def check_against_reference(fa_fn, ref_fn, inputs, dout, atol=ATOL, grad_atol=GRAD_ATOL):
    """fa_fn in the inputs' dtype vs ref_fn in float64, with ref_fn in the inputs' dtype as the
    naive baseline; checks out and every input gradient."""
    ours = torch_ref.values_and_grads(fa_fn, inputs, dout)
    ref = torch_ref.values_and_grads(ref_fn, [t.double() for t in inputs], dout)
    naive = torch_ref.values_and_grads(ref_fn, inputs, dout)
    names = ["out"] + [f"d{i}" for i in range(len(inputs))]
    for name, o, r, n in zip(names, ours, ref, naive):
        attn_ref.assert_fa_close(name, o, r, n, atol if name == "out" else grad_atol)


# ---- values and gradients -------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{b}_sq{sq}_sk{sk}_h{h}_hk{hk}_d{d}_dv{dv}".format(**s))
@pytest.mark.parametrize("opt", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()) or "plain")
def test_values_and_grads_match_float64_reference(shape, opt):
    g = gen(1)
    q, k, v = make_inputs(shape, g)
    dout = randn(shape["b"], shape["sq"], shape["h"], shape["dv"], g=g)
    alibi = alibi_for(opt.get("alibi"), shape["b"], shape["h"], g)
    check_against_reference(
        lambda q, k, v: flashattn.flash_attn_func(q, k, v, **fa_kwargs(opt, alibi)),
        lambda q, k, v: torch_ref.attention(q, k, v, **ref_kwargs(opt, alibi))[0],
        [q, k, v], dout)


def test_return_attn_probs_gives_out_lse_none():
    g = gen(2)
    s = SHAPES[2]
    q, k, v = (t.requires_grad_() for t in make_inputs(s, g))
    out, lse, s_dmask = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert s_dmask is None
    assert lse.dtype == torch.float32 and lse.shape == (s["b"], s["h"], s["sq"])
    assert not lse.requires_grad  # gradients flow through out only
    ref_out, ref_lse = torch_ref.attention(q.double(), k.double(), v.double(), causal=True)
    low_out, low_lse = torch_ref.attention(q, k, v, causal=True)
    attn_ref.assert_fa_close("lse", lse.numpy(), ref_lse.detach().numpy(),
                             low_lse.detach().numpy(), ATOL)
    assert torch.isneginf(lse[:, :, :4]).all()  # rows that see no key
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and (q.grad[:, :4] == 0).all()


def test_float16_and_bfloat16_on_cpu():
    g = gen(3)
    s = dict(b=2, sq=19, sk=27, h=4, hk=2, d=32, dv=32)
    for dtype, atol in ((torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)):
        q, k, v = make_inputs(s, g, dtype)
        dout = randn(s["b"], s["sq"], s["h"], s["dv"], g=g, dtype=dtype)
        check_against_reference(
            lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=True),
            lambda q, k, v: torch_ref.attention(q, k, v, causal=True)[0],
            [q, k, v], dout, atol=atol, grad_atol=4 * atol)


def test_deterministic_backward_is_bitwise_reproducible():
    g = gen(4)
    s = dict(b=2, sq=33, sk=47, h=4, hk=1, d=32, dv=32)
    q, k, v = make_inputs(s, g)
    dout = randn(s["b"], s["sq"], s["h"], s["dv"], g=g)
    fn = lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=True, deterministic=True)  # noqa: E731
    a = torch_ref.values_and_grads(fn, [q, k, v], dout)
    b = torch_ref.values_and_grads(fn, [q, k, v], dout)
    for x, y in zip(a, b):
        assert np.array_equal(x, y)


def test_no_grad_and_inference_mode():
    g = gen(5)
    q, k, v = (t.requires_grad_() for t in make_inputs(SHAPES[0], g))
    with torch.no_grad():
        a = flashattn.flash_attn_func(q, k, v)
    with torch.inference_mode():
        b = flashattn.flash_attn_func(q, k, v)
    assert not a.requires_grad and torch.equal(a, b)


def test_eager_inference_skips_the_dispatcher_and_nothing_else_does(monkeypatch):
    """flash_attn_func runs the call directly (the extension's torch fast path, direct=True)
    only when nothing needs the op: no autograd graph to record, no dispatch mode, not
    compiling. Both paths give equal results."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from flashattn import _C

    seen = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    g = gen(6)
    q, k, v = make_inputs(SHAPES[0], g)
    direct = []
    real = _C.torch_forward

    def counted(*a):
        result = real(*a)
        if a[-1] and result is not None and result is not True:  # direct=True, and it ran
            direct.append(1)
        return result

    monkeypatch.setattr(_C, "torch_forward", counted)
    plain = flashattn.flash_attn_func(q, k, v, causal=True)  # no tensor requires grad
    assert direct == [1]
    with torch.no_grad():
        flashattn.flash_attn_func(q.requires_grad_(), k, v, causal=True)
    assert direct == [1, 1]
    # q requires grad: recorded by an autograd.Function (the op's formula), not run directly.
    graphed = flashattn.flash_attn_func(q, k, v, causal=True)
    assert direct == [1, 1] and graphed.grad_fn is not None
    assert flashattn._torch_ops.last_route["forward"] == "fast_autograd"
    with Count():
        moded = flashattn.flash_attn_func(q.detach(), k, v, causal=True)
    assert direct == [1, 1] and any("flashattn" in f for f in seen)
    assert torch.equal(plain, graphed.detach()) and torch.equal(plain, moded)
    # Tracers, meta tensors, torch.func transforms and the profiler need the op too.
    with torch.no_grad():
        traced = torch.jit.trace(lambda a, b, c: flashattn.flash_attn_func(a, b, c, causal=True), (q.detach(), k, v))
        q2 = randn(*q.shape, g=g)
        assert torch.equal(traced(q2, k, v), flashattn.flash_attn_func(q2, k, v, causal=True))
    meta = flashattn.flash_attn_func(*(t.detach().to("meta") for t in (q, k, v)))
    assert meta.device.type == "meta" and meta.shape == q.shape
    batched = torch.vmap(lambda a, b, c: flashattn.flash_attn_func(a, b, c, causal=True))(
        q.detach()[None], k[None], v[None])
    assert torch.equal(batched[0], plain)
    with torch.profiler.profile() as prof:
        flashattn.flash_attn_func(q.detach(), k, v, causal=True)
    assert any("flashattn" in e.name for e in prof.events())
    # Direct since: torch.jit.trace's check and the comparison call, both outside tracing.
    assert direct == [1, 1, 1, 1]


# ---- layouts --------------------------------------------------------------------------------

def test_noncontiguous_inputs():
    g = gen(6)
    b, sq, sk, h, d = 2, 13, 21, 4, 32
    q = randn(b, h, sq, d, g=g).transpose(1, 2)          # (b, sq, h, d) view
    k = randn(b, sk, 2 * h, d, g=g)[:, :, ::2]           # every other head
    v = randn(b, sk + 5, h, d, g=g)[:, 3:3 + sk]          # a window of a longer buffer
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    dout = randn(b, h, sq, d, g=g).transpose(1, 2)        # non-contiguous gradient too
    check_against_reference(
        lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=True),
        lambda q, k, v: torch_ref.attention(q, k, v, causal=True)[0],
        [q, k, v], dout)
    # Last dimension not contiguous: copied (as flash_attn does), same result.
    qs = randn(b, sq, h, 2 * d, g=g)[..., ::2]
    assert torch.allclose(flashattn.flash_attn_func(qs, k, v), flashattn.flash_attn_func(qs.contiguous(), k, v))


def test_expanded_output_gradient():
    # out.sum() backpropagates a gradient with all strides 0.
    g = gen(7)
    q, k, v = (t.requires_grad_() for t in make_inputs(SHAPES[0], g))
    flashattn.flash_attn_func(q, k, v).sum().backward()
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    flashattn.flash_attn_func(q2, k2, v2).backward(torch.ones(q.shape))
    assert torch.allclose(q.grad, q2.grad) and torch.allclose(v.grad, v2.grad)


def test_packed_match_unpacked_values_and_grads():
    g = gen(8)
    b, s, h, d = 2, 19, 4, 32
    qkv = randn(b, s, 3, h, d, g=g)
    dout = randn(b, s, h, d, g=g)

    def unpacked(qkv):
        q, k, v = qkv.unbind(2)
        return flashattn.flash_attn_func(q, k, v, causal=True)

    ref = torch_ref.values_and_grads(unpacked, [qkv], dout)
    got = torch_ref.values_and_grads(
        lambda qkv: flashattn.flash_attn_qkvpacked_func(qkv, causal=True), [qkv], dout)
    for x, y in zip(ref, got):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)
    got = torch_ref.values_and_grads(
        lambda qkv: flashattn.flash_attn_kvpacked_func(qkv[:, :, 0], qkv[:, :, 1:], causal=True),
        [qkv], dout)
    for x, y in zip(ref, got):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)

    cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32)
    got = torch_ref.values_and_grads(
        lambda qkv: flashattn.flash_attn_varlen_qkvpacked_func(
            qkv.reshape(b * s, 3, h, d), cu, s, causal=True).reshape(b, s, h, d), [qkv], dout)
    for x, y in zip(ref, got):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    got = torch_ref.values_and_grads(
        lambda qkv: flashattn.flash_attn_varlen_kvpacked_func(
            qkv[:, :, 0].reshape(b * s, h, d), qkv[:, :, 1:].reshape(b * s, 2, h, d), cu, cu, s, s,
            causal=True).reshape(b, s, h, d), [qkv], dout)
    for x, y in zip(ref, got):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_matches_per_sequence(causal):
    g = gen(9)
    lens_q, lens_k = [5, 1, 17, 9], [7, 4, 17, 2]
    h, hk, d = 4, 2, 16
    q = randn(sum(lens_q), h, d, g=g)
    k = randn(sum(lens_k), hk, d, g=g)
    v = randn(sum(lens_k), hk, d, g=g)
    dout = randn(sum(lens_q), h, d, g=g)
    cu_q = torch.tensor(np.cumsum([0] + lens_q), dtype=torch.int32)
    cu_k = torch.tensor(np.cumsum([0] + lens_k), dtype=torch.int32)
    got = torch_ref.values_and_grads(
        lambda q, k, v: flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q),
                                                         max(lens_k), causal=causal),
        [q, k, v], dout)

    def per_sequence(q, k, v):
        outs = []
        for i in range(len(lens_q)):
            sq, sk = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
            outs.append(flashattn.flash_attn_func(q[None, sq], k[None, sk], v[None, sk],
                                                  causal=causal)[0])
        return torch.cat(outs)

    ref = torch_ref.values_and_grads(per_sequence, [q, k, v], dout)
    for x, y in zip(got, ref):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    _, lse, _ = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                                 causal=causal, return_attn_probs=True)
    assert lse.shape == (h, sum(lens_q))


# ---- dropout --------------------------------------------------------------------------------

def keep_mask_after_seed(torch_seed, b, h, sq, sk, p):
    """The keep mask (b, h, sq, sk) that flash_attn_func draws right after
    torch.manual_seed(torch_seed): with q = 0 every score is equal and v = identity, so
    out[b, i, h, j] = keep / (sk (1 - p))."""
    q = torch.zeros(b, sq, h, 8)
    k = torch.randn(b, sk, h, 8, generator=gen(0))
    v = torch.eye(sk)[None, :, None, :].expand(b, sk, h, sk)
    torch.manual_seed(torch_seed)
    out = flashattn.flash_attn_func(q, k, v, dropout_p=p)
    kept = out > 0
    torch.testing.assert_close(out[kept], torch.full_like(out[kept], 1 / (sk * (1 - p))))
    return kept.permute(0, 2, 1, 3)


def test_dropout_seed_reproducibility_and_keep_rate():
    g = gen(10)
    s = dict(b=2, sq=37, sk=53, h=4, hk=2, d=32, dv=32)
    q, k, v = make_inputs(s, g)
    outs = []
    for seed in (5, 5, 6):
        torch.manual_seed(seed)
        outs.append(flashattn.flash_attn_func(q, k, v, dropout_p=0.3))
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])
    # Consecutive calls draw fresh seeds.
    torch.manual_seed(5)
    a = flashattn.flash_attn_func(q, k, v, dropout_p=0.3)
    b = flashattn.flash_attn_func(q, k, v, dropout_p=0.3)
    assert not torch.equal(a, b)
    for p in (0.1, 0.5):
        kept = keep_mask_after_seed(11, 2, 4, 64, 64, p)
        rate = kept.double().mean().item()
        assert abs(rate - (1 - p)) < 5 * np.sqrt(p * (1 - p) / kept.numel()), rate


def test_dropout_backward_uses_the_forward_mask():
    g = gen(12)
    s = dict(b=2, sq=21, sk=29, h=4, hk=2, d=16, dv=16)
    p, seed = 0.25, 2024
    keep = keep_mask_after_seed(seed, s["b"], s["h"], s["sq"], s["sk"], p)
    q, k, v = make_inputs(s, g)
    dout = randn(s["b"], s["sq"], s["h"], s["dv"], g=g)

    def fa(q, k, v):
        torch.manual_seed(seed)  # the same seed as the mask read back above
        return flashattn.flash_attn_func(q, k, v, dropout_p=p, causal=True)

    check_against_reference(
        fa, lambda q, k, v: torch_ref.attention(q, k, v, causal=True, dropout_p=p, keep=keep)[0],
        [q, k, v], dout)


# ---- torch.library registrations and torch.compile -------------------------------------------

def opcheck_samples():
    g = gen(13)
    s = dict(b=2, sq=9, sk=12, h=4, hk=2, d=16, dv=16)
    q, k, v = (t.requires_grad_() for t in make_inputs(s, g))
    rng = torch.tensor([123, 456], dtype=torch.int64)
    ops = torch.ops.flashattn
    yield ops.fwd.default, (q, k, v, None, None, 0, 0, None, 0.0, True, -1, -1, 0.0, 0.0, None, False)
    yield ops.fwd.default, (q, k, v, None, None, 0, 0, torch.full((4,), 0.1), 0.25, False, 3, 2, 4.0, 0.2, rng, True)
    qkv = randn(2, 9, 3, 4, 16, g=g).requires_grad_()
    yield ops.fwd_qkvpacked.default, (qkv, None, 0, None, 0.0, True, -1, -1, 0.0, 0.1, rng, False)
    kv = randn(2, 12, 2, 2, 16, g=g).requires_grad_()
    yield ops.fwd_kvpacked.default, (q, kv, None, None, 0, 0, None, 0.0, False, -1, -1, 0.0, 0.0, None, False)
    cu_q = torch.tensor([0, 4, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 7, 12], dtype=torch.int32)
    yield ops.fwd.default, (q[0], k[0], v[0], cu_q, cu_k, 5, 7, None, 0.0, True, -1, -1, 0.0, 0.0, None, False)
    out, lse = ops.fwd(q.detach(), k.detach(), v.detach(), None, None, 0, 0, None, 0.0, True, -1, -1, 0.0, 0.0, None, False)
    yield ops.bwd.default, (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out, lse, None, None, 0, 0, None, 0.0, True, -1, -1, 0.0, 0.0, None, False)


@pytest.mark.parametrize("sample", range(6))
def test_opcheck(sample):
    op, args = list(opcheck_samples())[sample]
    torch.library.opcheck(op, args)


def test_compile_fullgraph_forward_and_backward():
    g = gen(14)
    s = dict(b=2, sq=17, sk=17, h=4, hk=2, d=32, dv=32)
    q, k, v = make_inputs(s, g)
    qkv = randn(2, 17, 3, 4, 32, g=g)
    dout = randn(2, 17, 4, 32, g=g)

    def f(q, k, v, qkv):
        a = flashattn.flash_attn_func(q, k, v, causal=True, softcap=3.0)
        b = flashattn.flash_attn_qkvpacked_func(qkv, window_size=(4, 4))
        c = flashattn.flash_attn_func(q, k, v, dropout_p=0.1)
        return a + b + 0 * c

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    eager = torch_ref.values_and_grads(f, [q, k, v, qkv], dout)
    got = torch_ref.values_and_grads(compiled, [q, k, v, qkv], dout)
    for x, y in zip(eager, got):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-6)


def test_compile_inductor_cpu():
    g = gen(15)
    q, k, v = make_inputs(dict(b=1, sq=16, sk=16, h=2, hk=2, d=16, dv=16), g)
    dout = randn(1, 16, 2, 16, g=g)

    def f(q, k, v):
        return flashattn.flash_attn_func(q * 2, k, v, causal=True).relu()

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True)
    for x, y in zip(torch_ref.values_and_grads(f, [q, k, v], dout),
                    torch_ref.values_and_grads(compiled, [q, k, v], dout)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)

    # With dropout the seed is drawn inside the graph (inductor's own RNG: values differ from
    # eager, so only check that it compiles without breaks and differentiates).
    compiled_dropout = torch.compile(
        lambda q, k, v: flashattn.flash_attn_func(q, k, v, dropout_p=0.2), fullgraph=True)
    grads = torch_ref.values_and_grads(compiled_dropout, [q, k, v], dout)
    assert all(np.isfinite(g).all() for g in grads)
    assert np.abs(grads[1]).max() > 0


# ---- model code that imports flashattn in place of flash_attn --------------------------------

def test_gpt_block_matches_sdpa_float32_cpu():
    gpt_block.run_check("cpu", torch.float32, 1e-4)


# ---- torch tensors: errors and the low-level API --------------------------------------------

def test_torch_errors_name_the_argument():
    g = gen(16)
    q, k, v = make_inputs(SHAPES[0], g)
    with pytest.raises(TypeError, match=r"\bq\b.*float64"):
        flashattn.flash_attn_func(q.double(), k.double(), v.double())
    with pytest.raises(TypeError, match=r"\bv\b.*dtype"):
        flashattn.flash_attn_func(q, k, v.half())
    with pytest.raises(ValueError, match=r"\bq\b.*4 dimensions"):
        flashattn.flash_attn_func(q[0], k, v)
    with pytest.raises(ValueError, match=r"\bk\b.*head_dim"):
        flashattn.flash_attn_func(q, k[..., :8], v)
    with pytest.raises(ValueError, match="qkv"):
        flashattn.flash_attn_qkvpacked_func(torch.randn(2, 5, 2, 4, 8))
    with pytest.raises(ValueError, match=r"\bk\b must have 4 dimensions \(num_blocks, page_size"):
        flashattn.flash_attn_varlen_func(q[0], k[0], v[0], torch.tensor([0, 17], dtype=torch.int32),
                                         torch.tensor([0, 17], dtype=torch.int32), 17, 17,
                                         block_table=torch.zeros(1, 1, dtype=torch.int32))
    with pytest.raises(TypeError, match="cu_seqlens_q"):
        flashattn.flash_attn_varlen_func(q[0], k[0], v[0], torch.tensor([0, 17]),
                                         torch.tensor([0, 17], dtype=torch.int32), 17, 17)


def test_lowlevel_api_with_torch_tensors():
    g = gen(17)
    s = SHAPES[3]
    q, k, v = (t.requires_grad_() for t in make_inputs(s, g))  # requires_grad: detached inside
    out = torch.empty(s["b"], s["sq"], s["h"], s["dv"])
    lse = torch.empty(s["b"], s["h"], s["sq"])
    flashattn.forward(q, k, v, out, lse, causal=True, dropout_p=0.2, seed=77)
    dout = torch.randn(out.shape, generator=g)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    flashattn.backward(dout, q, k, v, out, lse, dq, dk, dv, causal=True, dropout_p=0.2, seed=77)
    # The same numbers as the numpy arrays sharing this memory.
    out_np = np.empty(out.shape, dtype=np.float32)
    flashattn.forward(q.detach().numpy(), k.detach().numpy(), v.detach().numpy(), out_np,
                      causal=True, dropout_p=0.2, seed=77)
    assert np.array_equal(out_np, out.numpy())
    assert torch.isfinite(dq).all() and torch.isfinite(dk).all() and torch.isfinite(dv).all()


def test_extension_reads_tensors_that_require_grad():
    # torch's __dlpack__ refuses them; nanobind falls back to torch.utils.dlpack.to_dlpack.
    q, k, v = make_inputs(SHAPES[0], gen(18))
    a, b = torch.empty(q.shape), torch.empty(q.shape)
    assert flashattn._C.forward(q, k, v, a, None) is None
    assert flashattn._C.forward(q.requires_grad_(), k.requires_grad_(), v, b, None) is None
    assert torch.equal(a, b)


# ---- drop-in edges (issue 16) -----------------------------------------------------------------

@pytest.mark.parametrize("kind", ["nan_q", "nan_k", "inf_k"])
def test_non_finite_inputs_propagate_like_torch_sdpa(kind):
    """Per (row, head), the output is non-finite exactly where torch's math SDPA's is."""
    g = gen(7)
    q, k, v = make_inputs(dict(b=2, sq=70, sk=70, h=2, hk=2, d=32, dv=32), g)
    target = {"nan_q": q, "nan_k": k, "inf_k": k}[kind]
    target[1, 10, 1, 3] = float("inf") if kind == "inf_k" else float("nan")
    ours = flashattn.flash_attn_func(q, k, v, causal=True)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
    bad_ref = ~torch.isfinite(ref).all(dim=-1)
    if kind != "nan_q":
        # torch 2.5's math SDPA adds the causal mask to the scores, so the bad key's NaN (or
        # inf - inf) also reaches rows 0..9, which cannot see key 10. A masked key takes no
        # part in a row here: those rows stay finite whatever the torch release does.
        bad_ref[1, :10, 1] = False
    assert bad_ref.any()
    assert torch.equal(~torch.isfinite(ours).all(dim=-1), bad_ref)


@pytest.mark.parametrize("b,sq,sk", [(0, 5, 7), (2, 0, 7), (2, 5, 0)])
def test_empty_tensors_forward_and_backward(b, sq, sk):
    q = torch.randn(b, sq, 4, 16, requires_grad=True)
    k = torch.randn(b, sk, 2, 16, requires_grad=True)
    v = torch.randn(b, sk, 2, 16, requires_grad=True)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.shape == (b, sq, 4, 16) and torch.all(out == 0)
    assert torch.all(lse == float("-inf"))
    out.sum().backward()
    for t in (q, k, v):
        assert torch.all(t.grad == 0)


def test_causal_with_window_matches_left_window_and_compiles():
    g = gen(8)
    q, k, v = make_inputs(dict(b=2, sq=33, sk=40, h=4, hk=2, d=16, dv=16), g)
    a = flashattn.flash_attn_func(q, k, v, causal=True, window_size=(6, 6))
    b = flashattn.flash_attn_func(q, k, v, window_size=(6, 0))
    assert torch.equal(a, b)
