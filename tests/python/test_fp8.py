"""FP8 (float8_e4m3fn) through the Python layer (issue 21; docs/SEMANTICS.md, "FP8"): the
flash_attn functions on torch CPU tensors against the naive FP8 computation of attn_ref (tight:
bfloat16 output rounding plus the probabilities a float32 logit may round the other way) and
against float64 of the dequantized inputs (FlashAttention's criterion), descale broadcasting,
varlen, the FP8 KV cache (dense, paged, append), the custom ops' fake shapes, autograd's refusal
and the error paths. CUDA: the e4m3 cache read by 16-bit queries against the CPU backend (the
append bitwise) and the float64 reference, dense and paged (pages 1/16/256), with rotary, GQA,
ragged lengths and forced split-KV; the FP8 forward (e4m3 q, the Hopper kernels) against the CPU
backend and the naive FP8 computation, and what it declines.

torch is needed (numpy has no float8 without ml_dtypes and no bfloat16 for the output); the
module is skipped without it, as CI (no torch) does.
"""

import os

import numpy as np
import pytest

import attn_ref

torch = pytest.importorskip("torch")
import flashattn  # noqa: E402
from flashattn import _torch_ops  # noqa: E402

FP8 = torch.float8_e4m3fn
LOG2E = 1.0 / np.log(2.0)


def quantize(x, heads_k, per_head=True):
    """(codes float8 tensor, descale float32 (batch, heads_k)) with x ~ codes * descale; x is a
    float32 (batch, seqlen, heads, d) tensor whose heads are grouped over heads_k."""
    b, s, h, d = x.shape
    g = x.reshape(b, s, heads_k, h // heads_k, d)
    amax = g.abs().amax(dim=(1, 3, 4)) if per_head else x.abs().amax().expand(b, heads_k)
    descale = (amax.clamp_min(1e-3) / 336.0).to(torch.float32).contiguous()
    codes = (g / descale[:, None, :, None, None]).reshape(b, s, h, d).to(FP8)
    return codes, descale


def dequantize(codes, descale):
    b, s, h, d = codes.shape
    hk = descale.shape[1]
    x = codes.to(torch.float64).reshape(b, s, hk, h // hk, d)
    return (x * descale.to(torch.float64)[:, None, :, None, None]).reshape(b, s, h, d).numpy()


def naive_tolerance(q, k, v, naive, scale, causal, window, softcap, sink, acc_eps=0.0):
    """Per-element bound on |ours - naive| (numpy float64 inputs, (b, s, h, d) layouts): one
    bfloat16 ulp of the value, plus, for every probability within 2^-12 of an e4m3 rounding
    boundary (or in e4m3's subnormal range), one e4m3 ulp of its weight times |v|.

    acc_eps > 0 (the CUDA kernels on Hopper, tests/cpp/test_fp8.cpp naive_tolerance): each k32
    step of the tensor cores' FP8 accumulation keeps about 14 bits, losing up to acc_eps of the
    magnitude summed so far. Logits move by up to dx = acc_eps * (d / 32) * scale * log2(e) *
    sum |q k| (the flip window widens to ln 2 * dx, and a row whose maximum is within max dx of an
    integer may take the other reference), and each output by acc_eps * (k32 steps of P V) *
    sum P |v| / L."""
    h = q.shape[2]
    ke, ve = np.repeat(k, h // k.shape[2], axis=2), np.repeat(v, h // v.shape[2], axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, ke) * scale
    if softcap > 0:
        s = softcap * np.tanh(s / softcap)
    vis = attn_ref.visible(q.shape[1], k.shape[1], causal, window)
    s = np.where(vis, s, -np.inf)
    x = s * LOG2E
    dx = acc_eps * np.ceil(q.shape[3] / 32) * scale * LOG2E * np.einsum("bihd,bjhd->bhij", np.abs(q), np.abs(ke))
    dx = np.where(vis, dx, 0.0)
    mx = x.max(axis=-1, keepdims=True)
    r = np.where(np.isfinite(mx), np.ceil(mx) - 8.0, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        pv = np.where(np.isfinite(x), np.exp2(x - r), 0.0)
        total = pv.sum(axis=-1, keepdims=True)
        if sink is not None:
            total = total + np.exp2(np.asarray(sink)[None, :, None, None] * LOG2E - r)
        m = pv / np.exp2(np.floor(np.log2(np.where(pv > 0, pv, 1.0))))
        frac = m * 8.0 - np.floor(m * 8.0)
        window_frac = np.where(dx > 0, np.maximum(8.0 * 2.0 ** -12, 16.0 * dx / LOG2E), 8.0 * 2.0 ** -12)
        near = np.abs(frac - 0.5) < window_frac
        if acc_eps > 0:
            dx_max = dx.max(axis=-1, keepdims=True)
            near = near | (np.abs(mx - np.round(mx)) < np.maximum(2.0 ** -12 * np.maximum(1.0, np.abs(mx)), dx_max))
        slack = np.where(pv <= 0, 0.0, np.where(pv < 2.0 ** -5, 2.0 ** -9, np.where(near, pv / 8, 0)))
        safe_total = np.where(total > 0, total, 1.0)
        weight = np.where(total > 0, slack / safe_total, 0.0)
        acc_weight = np.where(total > 0, 1.0625 * pv / safe_total, 0.0)
    extra = np.einsum("bhij,bjhd->bihd", weight, np.abs(ve)) * 1.01
    if acc_eps > 0:
        pv_steps = np.ceil(k.shape[1] / 32) + 1
        extra = extra + acc_eps * pv_steps * np.einsum("bhij,bjhd->bihd", acc_weight, np.abs(ve))
    return np.abs(naive) * 2.0 ** -8 + 1e-6 + extra


CASES = [
    dict(name="gqa", b=2, sq=37, sk=83, h=4, hk=2, d=64),
    dict(name="causal_mqa", b=1, sq=70, sk=70, h=4, hk=1, d=128, causal=True),
    dict(name="window_softcap", b=2, sq=50, sk=90, h=2, hk=2, d=64, window=(16, 4), softcap=5.0),
    dict(name="sink", b=2, sq=20, sk=65, h=4, hk=2, d=32, sink=True, causal=True),
    dict(name="scalar_descale", b=2, sq=33, sk=33, h=2, hk=2, d=64, per_head=False),
]


def _case_inputs(case, seed):
    """A case's shape and options, and its e4m3 q, k, v with their descales and the sink, drawn
    from a generator seeded with `seed`."""
    g = torch.Generator().manual_seed(seed)
    b, sq, sk, h, hk, d = (case[n] for n in ("b", "sq", "sk", "h", "hk", "d"))
    x = [torch.randn(b, s, hh, d, generator=g) for s, hh in ((sq, h), (sk, hk), (sk, hk))]
    (q8, qd), (k8, kd), (v8, vd) = (quantize(t, hk, case.get("per_head", True)) for t in x)
    sink = torch.rand(h, generator=g) * 2 - 1 if case.get("sink") else None
    return (b, sq, sk, h, hk, d), (q8, qd, k8, kd, v8, vd, sink)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_flash_attn_func_fp8_matches_naive_and_float64(case):
    (b, sq, sk, h, hk, d), (q8, qd, k8, kd, v8, vd, sink) = _case_inputs(case, 3)
    causal, window = case.get("causal", False), case.get("window", (-1, -1))
    softcap = case.get("softcap", 0.0)
    out, lse, _ = flashattn.flash_attn_func(
        q8, k8, v8, causal=causal, window_size=window, softcap=softcap, learnable_sink=sink,
        return_attn_probs=True, q_descale=qd, k_descale=kd, v_descale=vd)
    assert out.dtype == torch.bfloat16 and out.shape == (b, sq, h, d)
    qf, kf, vf = dequantize(q8, qd), dequantize(k8, kd), dequantize(v8, vd)
    kw = dict(scale=d ** -0.5, causal=causal, window=window, softcap=softcap,
              sink=None if sink is None else sink.double().numpy())
    naive, _ = attn_ref.forward(qf, kf, vf, fp8_round_p=True, **kw)
    exact, lse_ref = attn_ref.forward(qf, kf, vf, **kw)
    ours = out.double().numpy()
    tol = naive_tolerance(qf, kf, vf, naive, d ** -0.5, causal, window, softcap, kw["sink"])
    assert (np.abs(ours - naive) <= tol).all(), np.abs(ours - naive).max()
    attn_ref.assert_fa_close("out", ours, exact, naive, atol=2.0 ** -8 * np.abs(exact).max())
    np.testing.assert_allclose(lse.double().numpy(), lse_ref, rtol=2e-5, atol=2e-5)


def test_varlen_fp8_equals_per_sequence_calls():
    g = torch.Generator().manual_seed(5)
    lens_q, lens_k = [5, 33, 1], [9, 70, 1]
    h, hk, d = 4, 2, 64
    q = torch.randn(sum(lens_q), h, d, generator=g).to(FP8)
    k = torch.randn(sum(lens_k), hk, d, generator=g).to(FP8)
    v = torch.randn(sum(lens_k), hk, d, generator=g).to(FP8)
    descale = torch.rand(3, hk, generator=g) + 0.5
    cu_q = torch.tensor(np.cumsum([0] + lens_q), dtype=torch.int32)
    cu_k = torch.tensor(np.cumsum([0] + lens_k), dtype=torch.int32)
    out = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                           causal=True, q_descale=descale, k_descale=descale,
                                           v_descale=descale)
    for i in range(3):
        qs, ks = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        one = flashattn.flash_attn_func(q[None, qs], k[None, ks], v[None, ks], causal=True,
                                        q_descale=descale[i:i + 1], k_descale=descale[i:i + 1],
                                        v_descale=descale[i:i + 1])
        assert torch.equal(out[qs], one[0])


def test_descale_broadcasts_like_a_full_tensor():
    g = torch.Generator().manual_seed(9)
    q = torch.randn(2, 16, 4, 32, generator=g).to(FP8)
    k = torch.randn(2, 24, 2, 32, generator=g).to(FP8)
    v = torch.randn(2, 24, 2, 32, generator=g).to(FP8)
    full = torch.full((2, 2), 0.25)
    want = flashattn.flash_attn_func(q, k, v, q_descale=full, k_descale=full, v_descale=full)
    for d in (torch.tensor(0.25), torch.tensor([0.25]), torch.full((2, 1), 0.25),
              torch.full((1, 2), 0.25), full.expand(2, 2)):
        got = flashattn.flash_attn_func(q, k, v, q_descale=d, k_descale=d, v_descale=d)
        assert torch.equal(got, want), tuple(d.shape)
    with pytest.raises(ValueError, match=r"q_descale must have shape \(batch, heads_k\) = \(2, 2\)"):
        flashattn.flash_attn_func(q, k, v, q_descale=torch.ones(3))
    # The packed layouts take them too.
    kv = torch.stack([k.view(torch.uint8), v.view(torch.uint8)], dim=2).view(FP8)  # no fp8 cat on CPU
    got = flashattn.flash_attn_kvpacked_func(q, kv, q_descale=full, k_descale=full, v_descale=full)
    assert torch.equal(got, want)


def test_lowlevel_forward_takes_float8_tensors():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 8, 2, 16, generator=g).to(FP8)
    k = torch.randn(1, 8, 2, 16, generator=g).to(FP8)
    out = torch.empty(1, 8, 2, 16, dtype=torch.bfloat16)
    flashattn.forward(q, k, k, out, k_descale=torch.full((1, 2), 0.5))
    assert torch.equal(out, flashattn.flash_attn_func(q, k, k, k_descale=torch.full((1, 2), 0.5)))


def test_errors():
    q = torch.randn(1, 8, 2, 16).to(FP8)
    kb = torch.randn(1, 8, 2, 16, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="k must have dtype float8_e4m3"):
        flashattn.flash_attn_func(q, kb, kb)
    # A message about a dtype is a TypeError (the binding's rule, python/src/module.cpp).
    with pytest.raises(TypeError, match="q_descale was given but q has dtype bfloat16"):
        flashattn.flash_attn_func(kb, kb, kb, q_descale=torch.ones(1, 2))
    with pytest.raises(TypeError, match="q_descale must have dtype float32"):
        flashattn.flash_attn_func(q, q, q, q_descale=torch.ones(1, 2, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"v_descale\[0, 1\]"):
        flashattn.flash_attn_func(q, q, q, v_descale=torch.tensor([[1.0, 0.0]]))
    with pytest.raises(NotImplementedError, match="dropout_p"):
        flashattn.flash_attn_func(q, q, q, dropout_p=0.1)


def test_numpy_float8_is_refused_by_the_flash_attn_functions():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q = np.zeros((1, 2, 1, 8), dtype=ml_dtypes.float8_e4m3fn)
    with pytest.raises(TypeError, match="torch tensors"):
        flashattn.flash_attn_func(q, q, q)


def test_autograd_refuses_fp8_backward():
    q = torch.randn(1, 8, 2, 16).to(FP8).requires_grad_()
    k = torch.randn(1, 8, 2, 16).to(FP8)
    out = flashattn.flash_attn_func(q, k, k)
    assert out.dtype == torch.bfloat16
    with pytest.raises(NotImplementedError, match="no backward for float8_e4m3fn"):
        out.float().sum().backward()


def test_fake_tensor_shapes_and_dtypes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 8, 4, 64, dtype=FP8)
        k = torch.empty(2, 9, 2, 64, dtype=FP8)
        d = torch.ones(2, 2)
        out, lse = _torch_ops.fwd(q, k, k, None, None, 0, 0, None, 0.125, False, -1, -1, 0.0,
                                  0.0, None, False, None, None, None, None, 0, 0, None, None,
                                  None, None, d, d, d)
        assert out.dtype == torch.bfloat16 and out.shape == (2, 8, 4, 64)
        assert lse.dtype == torch.float32 and lse.shape == (2, 4, 8)
        kc = torch.empty(2, 32, 2, 64, dtype=FP8)
        qb = torch.empty(2, 1, 4, 64, dtype=torch.bfloat16)
        out, _ = _torch_ops.fwd_kvcache(qb, kc, torch.empty_like(kc), None, None, None, None, None, None, None,
                                        None, None, 0.125, False, -1, -1, 0.0, True, 0, None,
                                        None, d, d)
        assert out.dtype == torch.bfloat16
    # Through the op (not the eager shortcut): the dispatcher sees float8 in and bfloat16 out.
    q = torch.randn(1, 4, 2, 16).to(FP8)
    out, _ = _torch_ops.fwd(q, q, q, None, None, 0, 0, None, 0.25, False, -1, -1, 0.0, 0.0, None,
                            False)
    assert torch.equal(out, flashattn.flash_attn_func(q, q, q, softmax_scale=0.25))


def _cache_case(page_size, fp8_q, seed=4):
    g = torch.Generator().manual_seed(seed)
    b, h, hk, d, cap, sq, snew = 2, 4, 2, 64, 64, 2, 3
    lens = torch.tensor([10, 40], dtype=torch.int32)
    kd = torch.rand(b, hk, generator=g) * 0.02 + 0.01
    vd = torch.rand(b, hk, generator=g) * 0.02 + 0.01
    k_cache = (torch.randn(b, cap, hk, d, generator=g) * 50).to(FP8)
    v_cache = (torch.randn(b, cap, hk, d, generator=g) * 50).to(FP8)
    dt = FP8 if fp8_q else torch.bfloat16
    scale_new = 50 if fp8_q else 0.5
    q = (torch.randn(b, sq, h, d, generator=g) * (50 if fp8_q else 1)).to(dt)
    k = (torch.randn(b, snew, hk, d, generator=g) * scale_new).to(dt)
    v = (torch.randn(b, snew, hk, d, generator=g) * scale_new).to(dt)
    qd = torch.full((b, hk), 0.02) if fp8_q else None
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, k=k, v=v, cache_seqlens=lens,
                k_descale=kd, v_descale=vd, q_descale=qd, page_size=page_size)


def _run_cache(c):
    kc, vc = c["k_cache"].clone(), c["v_cache"].clone()
    extra = {}
    if c["page_size"]:
        ps = c["page_size"]
        b, cap = kc.shape[:2]
        pages = kc.shape[0] * cap // ps
        perm = torch.randperm(pages, generator=torch.Generator().manual_seed(1))
        kp = torch.empty((pages, ps) + tuple(kc.shape[2:]), dtype=FP8)
        vp = torch.empty_like(kp)
        kp.view(torch.uint8)[perm] = kc.view(torch.uint8).reshape(pages, ps, *kc.shape[2:])
        vp.view(torch.uint8)[perm] = vc.view(torch.uint8).reshape(pages, ps, *kc.shape[2:])
        extra["block_table"] = perm.reshape(b, cap // ps).to(torch.int32)
        kc, vc = kp, vp
    out = flashattn.flash_attn_with_kvcache(
        c["q"], kc, vc, c["k"], c["v"], cache_seqlens=c["cache_seqlens"], causal=True,
        q_descale=c["q_descale"], k_descale=c["k_descale"], v_descale=c["v_descale"], **extra)
    if c["page_size"]:
        perm = extra["block_table"].reshape(-1)
        kc = kc.view(torch.uint8)[perm].reshape(c["k_cache"].shape).view(FP8)
        vc = vc.view(torch.uint8)[perm].reshape(c["v_cache"].shape).view(FP8)
    return out, kc, vc


@pytest.mark.parametrize("fp8_q", [False, True], ids=["bf16_q", "fp8_q"])
def test_fp8_kvcache_dense_and_paged(fp8_q):
    c = _cache_case(0, fp8_q)
    out, kc, vc = _run_cache(c)
    for ps in (1, 16):
        paged = _run_cache(_cache_case(ps, fp8_q))
        assert torch.equal(paged[0], out)
        assert torch.equal(paged[1].view(torch.uint8), kc.view(torch.uint8))
    lens, snew = c["cache_seqlens"], c["k"].shape[1]
    kd, vd = c["k_descale"], c["v_descale"]
    for b in range(2):
        rows = slice(int(lens[b]), int(lens[b]) + snew)
        if fp8_q:  # copied as they are
            want_k, want_v = c["k"][b], c["v"][b]
        else:  # quantized: e4m3(x / descale), saturating (computed here in float64)
            want_k = attn_ref.round_e4m3(c["k"][b].double().numpy() / kd[b][None, :, None].double().numpy())
            want_v = attn_ref.round_e4m3(c["v"][b].double().numpy() / vd[b][None, :, None].double().numpy())
            want_k, want_v = torch.from_numpy(want_k).to(FP8), torch.from_numpy(want_v).to(FP8)
        assert torch.equal(kc[b, rows].view(torch.uint8), want_k.view(torch.uint8))
        assert torch.equal(vc[b, rows].view(torch.uint8), want_v.view(torch.uint8))
        n = int(lens[b]) + snew
        kf = kc[b:b + 1, :n].double() * kd[b][None, None, :, None].double()
        vf = vc[b:b + 1, :n].double() * vd[b][None, None, :, None].double()
        qf = c["q"][b:b + 1].double()
        if fp8_q:
            qf = qf * c["q_descale"][b][None, None, :, None].repeat_interleave(2, dim=2).double()
        ref, _ = attn_ref.forward(qf.numpy(), kf.numpy(), vf.numpy(), causal=True,
                                  fp8_round_p=fp8_q)
        atol = (0.02 if fp8_q else 4e-3) * np.abs(ref).max()
        np.testing.assert_allclose(out[b:b + 1].double().numpy(), ref, rtol=2 ** -7, atol=atol)


def test_fp8_kvcache_errors():
    c = _cache_case(0, False)
    with pytest.raises(TypeError, match="q_descale was given but q has dtype bfloat16"):
        flashattn.flash_attn_with_kvcache(c["q"], c["k_cache"], c["v_cache"],
                                          q_descale=torch.ones(2, 2))
    with pytest.raises(TypeError, match="k must have dtype bfloat16"):
        flashattn.flash_attn_with_kvcache(c["q"], c["k_cache"], c["v_cache"], c["k_cache"][:, :1],
                                          c["v_cache"][:, :1], cache_seqlens=3)


# ---- CUDA ------------------------------------------------------------------------------------------

def _cuda_or_skip():
    if not flashattn.cuda_built() or not flashattn.cuda_available() or not torch.cuda.is_available():
        pytest.skip("no usable CUDA GPU for flashattn")
    return torch.device("cuda", torch.cuda.current_device())


# The relative precision of one k32 step of the tensor cores' FP8 accumulation (naive_tolerance).
WGMMA_FP8_STEP_EPS = 2.0 ** -12


def _fp8_cuda_runs(dev):
    """Whether the CUDA FP8 forward runs here (a Hopper GPU, not FLASHATTN_CUDA_PATH=sm80), and
    otherwise what its error names."""
    hopper = torch.cuda.get_device_capability(dev)[0] == 9
    if hopper and os.environ.get("FLASHATTN_CUDA_PATH") != "sm80":
        return True, None
    return False, "FLASHATTN_CUDA_PATH=sm80" if hopper else "Hopper"


CUDA_CASES = [
    dict(name="d128_gqa", b=2, sq=300, sk=300, h=8, hk=2, d=128),
    dict(name="d128_causal", b=2, sq=333, sk=333, h=4, hk=2, d=128, causal=True),
    dict(name="d128_causal_sq_lt_sk", b=1, sq=100, sk=700, h=4, hk=2, d=128, causal=True),
    dict(name="d128_window", b=1, sq=400, sk=400, h=2, hk=1, d=128, window=(64, 16)),
    dict(name="d128_sink_scalar_descale", b=2, sq=150, sk=150, h=4, hk=2, d=128, causal=True,
         sink=True, per_head=False),
    dict(name="d128_softcap_window", b=1, sq=300, sk=300, h=4, hk=2, d=128, window=(50, 10), softcap=8.0),
    dict(name="d64_causal", b=2, sq=257, sk=257, h=4, hk=2, d=64, causal=True),
    dict(name="d256_gqa", b=1, sq=200, sk=300, h=4, hk=2, d=256),
    # d256's 128-key tile (240 consumer registers, one transposer item per pass): its window kernel.
    dict(name="d256_causal", b=1, sq=333, sk=333, h=4, hk=2, d=256, causal=True),
    dict(name="d256_window_sink", b=1, sq=300, sk=300, h=4, hk=2, d=256, window=(64, 16), sink=True),
]


def _check_cuda_against_cpu_and_naive(ours, cpu, q8, k8, v8, qd, kd, vd, causal, window, sink, softcap=0.0):
    """The CUDA output against the naive FP8 computation (the CPU criterion widened by the tensor
    cores' accumulation) and against the CPU backend's output (each within its tolerance of the
    naive one); FlashAttention's criterion against float64 of the dequantized inputs."""
    d = q8.shape[-1]
    qf, kf, vf = dequantize(q8, qd), dequantize(k8, kd), dequantize(v8, vd)
    kw = dict(scale=d ** -0.5, causal=causal, window=window, sink=sink, softcap=softcap)
    naive, _ = attn_ref.forward(qf, kf, vf, fp8_round_p=True, **kw)
    exact, lse_ref = attn_ref.forward(qf, kf, vf, **kw)
    tol = naive_tolerance(qf, kf, vf, naive, d ** -0.5, causal, window, softcap, sink, WGMMA_FP8_STEP_EPS)
    cpu_tol = naive_tolerance(qf, kf, vf, naive, d ** -0.5, causal, window, softcap, sink)
    assert (np.abs(ours - naive) <= tol).all(), np.abs(ours - naive).max()
    assert (np.abs(ours - cpu) <= tol + cpu_tol).all(), np.abs(ours - cpu).max()
    attn_ref.assert_fa_close("out", ours, exact, naive, atol=2.0 ** -8 * np.abs(exact).max())
    # The LSE's bound: the float32 one plus, per row, ln 2 times the largest logit error the
    # tensor cores' accumulation allows (naive_tolerance's dx), as the C++ test takes it.
    h = qf.shape[2]
    ke = np.repeat(kf, h // kf.shape[2], axis=2)
    vis = attn_ref.visible(qf.shape[1], kf.shape[1], causal, window)
    absdot = np.where(vis, np.einsum("bihd,bjhd->bhij", np.abs(qf), np.abs(ke)), 0.0)
    dx_max = WGMMA_FP8_STEP_EPS * np.ceil(d / 32) * d ** -0.5 * LOG2E * absdot.max(axis=-1)
    lse_tol = 2e-5 * np.maximum(1.0, np.abs(np.where(np.isfinite(lse_ref), lse_ref, 0.0))) + dx_max / LOG2E
    return lse_ref, lse_tol


def _check_fp8_case(case, dev):
    """One CUDA_CASES entry on `dev` (CUDA; "cpu" checks the harness itself without a GPU)."""
    (b, sq, sk, h, hk, d), (q8, qd, k8, kd, v8, vd, sink) = _case_inputs(case, 11)
    causal, window = case.get("causal", False), case.get("window", (-1, -1))
    softcap = case.get("softcap", 0.0)

    def run(device):
        to = (lambda t: None if t is None else t.to(device))
        return flashattn.flash_attn_func(
            to(q8), to(k8), to(v8), causal=causal, window_size=window, softcap=softcap, learnable_sink=to(sink),
            return_attn_probs=True, q_descale=to(qd), k_descale=to(kd), v_descale=to(vd))

    if dev != "cpu":
        runs, reason = _fp8_cuda_runs(dev)
        if not runs:
            with pytest.raises(TypeError, match=reason):
                run(dev)
            return
    out, lse, _ = run(dev)
    assert out.dtype == torch.bfloat16 and out.shape == (b, sq, h, d)
    cpu_out, _, _ = run("cpu")
    sink64 = None if sink is None else sink.double().numpy()
    lse_ref, lse_tol = _check_cuda_against_cpu_and_naive(out.cpu().double().numpy(), cpu_out.double().numpy(),
                                                         q8, k8, v8, qd, kd, vd, causal, window, sink64, softcap)
    # The LSE of the unrounded scores, up to the tensor cores' accumulation of the logits.
    ours_lse = lse.cpu().double().numpy()
    inf = np.isinf(lse_ref)
    assert np.array_equal(ours_lse[inf], lse_ref[inf])
    assert (np.abs(ours_lse - lse_ref)[~inf] <= lse_tol[~inf]).all(), np.abs(ours_lse - lse_ref)[~inf].max()


@pytest.mark.parametrize("case", CUDA_CASES, ids=[c["name"] for c in CUDA_CASES])
def test_cuda_fp8_forward_matches_cpu_and_naive(case):
    _check_fp8_case(case, _cuda_or_skip())


HARNESS_CASES = [c for c in CUDA_CASES if c["name"] in ("d128_gqa", "d128_softcap_window")]


@pytest.mark.parametrize("case", HARNESS_CASES, ids=[c["name"] for c in HARNESS_CASES])
def test_cuda_fp8_harness_holds_for_the_cpu_backend(case):
    """The CUDA cases' checks, with the CPU backend in CUDA's place (runs without a GPU)."""
    _check_fp8_case(case, "cpu")


def _check_fp8_varlen(dev):
    g = torch.Generator().manual_seed(13)
    lens, h, hk, d = [1, 17, 130, 1000], 4, 2, 128
    xs = [[torch.randn(1, n, hh, d, generator=g) for hh in (h, hk, hk)] for n in lens]
    quant = [[quantize(t, hk) for t in seq] for seq in xs]
    q = torch.cat([qq[0][0][0] for qq in quant])
    k = torch.cat([qq[1][0][0] for qq in quant])
    v = torch.cat([qq[2][0][0] for qq in quant])
    qd, kd, vd = (torch.cat([qq[i][1] for qq in quant]) for i in range(3))
    cu = torch.tensor(np.cumsum([0] + lens), dtype=torch.int32)

    def run(device):
        return flashattn.flash_attn_varlen_func(
            q.to(device), k.to(device), v.to(device), cu.to(device), cu.to(device), max(lens), max(lens),
            causal=True, q_descale=qd.to(device), k_descale=kd.to(device), v_descale=vd.to(device))

    if dev != "cpu":
        runs, reason = _fp8_cuda_runs(dev)
        if not runs:
            with pytest.raises(TypeError, match=reason):
                run(dev)
            return
    out = run(dev).cpu()
    cpu = run("cpu")
    for i in range(len(lens)):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        (q8, qdi), (k8, kdi), (v8, vdi) = quant[i]
        _check_cuda_against_cpu_and_naive(out[None, rows].double().numpy(), cpu[None, rows].double().numpy(),
                                          q8, k8, v8, qdi, kdi, vdi, True, (-1, -1), None)


def test_cuda_fp8_varlen_ragged_matches_cpu_and_naive():
    """Ragged lengths (1, 17, 130, 1000: one, partial and many key blocks), GQA, causal, distinct
    per-(sequence, kv head) descales; each sequence checked on its own."""
    _check_fp8_varlen(_cuda_or_skip())


def test_cuda_fp8_varlen_harness_holds_for_the_cpu_backend():
    _check_fp8_varlen("cpu")


def test_cuda_fp8_forward_declines():
    """What the CUDA FP8 forward does not take is refused naming the reason (TypeError: the
    message names q's dtype), never run another way; forward_kvcache with an e4m3 q has no CUDA
    kernel."""
    dev = _cuda_or_skip()
    runs, reason = _fp8_cuda_runs(dev)
    q = torch.randn(2, 128, 4, 128, device=dev).to(FP8)
    k = torch.randn(2, 128, 2, 128, device=dev).to(FP8)
    d = torch.ones(2, 2, device=dev)
    q96, k96 = q[..., :96].contiguous(), k[..., :96].contiguous()
    with pytest.raises(TypeError, match="head_dim 96" if runs else reason):
        flashattn.flash_attn_func(q96, k96, k96, q_descale=d, k_descale=d, v_descale=d)
    # The all-e4m3 mode of the FP8 KV cache.
    with pytest.raises(TypeError, match="q has dtype float8_e4m3"):
        flashattn.flash_attn_with_kvcache(q[:, :1], k, k.clone(), cache_seqlens=100, q_descale=d,
                                          k_descale=d, v_descale=d)


def _cuda_cache_case(d, page_size, dtype=torch.bfloat16, sq=1, snew=1, rotary=True, interleaved=True,
                     causal=True, heads=8, heads_k=2, num_splits=0, seed=3):
    """An e4m3 cache read by 16-bit queries: ragged lengths (one sequence nearly empty), per-(b, hk)
    descales, new tokens appended with rotary."""
    g = torch.Generator().manual_seed(seed)
    b, cap = 3, 1024
    lens = torch.tensor([2, 131, 900], dtype=torch.int32)
    kd = torch.rand(b, heads_k, generator=g) * 0.02 + 0.005
    vd = torch.rand(b, heads_k, generator=g) * 0.02 + 0.005
    k_cache = (torch.randn(b, cap, heads_k, d, generator=g) * 40).to(FP8)
    v_cache = (torch.randn(b, cap, heads_k, d, generator=g) * 40).to(FP8)
    q = torch.randn(b, sq, heads, d, generator=g).to(dtype)
    k = (torch.randn(b, snew, heads_k, d, generator=g) * 3).to(dtype) if snew else None
    v = (torch.randn(b, snew, heads_k, d, generator=g) * 3).to(dtype) if snew else None
    cos = sin = None
    if rotary and snew:
        rd = d // 2
        angle = torch.arange(cap, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(rd // 2) * 2.0 / rd)
        cos, sin = angle.cos().to(dtype), angle.sin().to(dtype)
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, k=k, v=v, cos=cos, sin=sin, interleaved=interleaved,
                cache_seqlens=lens, k_descale=kd, v_descale=vd, page_size=page_size, causal=causal,
                num_splits=num_splits)


def _run_cache_on(c, dev):
    """Runs the case on `dev`; returns (out, k_cache, v_cache) on the CPU, caches in dense order."""
    kc, vc = c["k_cache"].clone(), c["v_cache"].clone()
    extra = {}
    if c["page_size"]:
        ps = c["page_size"]
        b, cap = kc.shape[:2]
        pages = b * cap // ps
        perm = torch.randperm(pages, generator=torch.Generator().manual_seed(1))
        kp = torch.empty((pages, ps) + tuple(kc.shape[2:]), dtype=torch.uint8)
        vp = torch.empty_like(kp)
        kp[perm] = kc.view(torch.uint8).reshape(pages, ps, *kc.shape[2:])
        vp[perm] = vc.view(torch.uint8).reshape(pages, ps, *kc.shape[2:])
        extra["block_table"] = perm.reshape(b, cap // ps).to(torch.int32).to(dev)
        kc, vc = kp.view(FP8), vp.view(FP8)
    kc, vc = kc.to(dev), vc.to(dev)
    moved = {n: (c[n].to(dev) if c[n] is not None else None)
             for n in ("q", "k", "v", "cos", "sin", "cache_seqlens", "k_descale", "v_descale")}
    out = flashattn.flash_attn_with_kvcache(
        moved["q"], kc, vc, moved["k"], moved["v"], rotary_cos=moved["cos"], rotary_sin=moved["sin"],
        cache_seqlens=moved["cache_seqlens"], causal=c["causal"], rotary_interleaved=c["interleaved"],
        num_splits=c["num_splits"], k_descale=moved["k_descale"], v_descale=moved["v_descale"], **extra)
    kc, vc = kc.cpu().view(torch.uint8), vc.cpu().view(torch.uint8)
    if c["page_size"]:
        perm = extra["block_table"].cpu().reshape(-1)
        kc = kc[perm].reshape(c["k_cache"].shape)
        vc = vc[perm].reshape(c["v_cache"].shape)
    return out.cpu(), kc, vc


def _rotate_ref(x, cos, sin, pos, interleaved):
    """x (heads, d) float64 rotated at table row pos (the test's own rotary)."""
    x = x.clone()
    c, s = cos[pos].double(), sin[pos].double()
    half = c.shape[0]
    if interleaved:
        a, b = x[:, 0:2 * half:2].clone(), x[:, 1:2 * half:2].clone()
        x[:, 0:2 * half:2], x[:, 1:2 * half:2] = a * c - b * s, a * s + b * c
    else:
        a, b = x[:, :half].clone(), x[:, half:2 * half].clone()
        x[:, :half], x[:, half:2 * half] = a * c - b * s, a * s + b * c
    return x


# The head dims the CUDA backend runs an e4m3 cache at today (cuda/common/variants.h).
CUDA_FP8_CACHE_HEAD_DIMS = (64, 128, 256)

CUDA_CACHE_CASES = (
    [dict(d=d, page_size=ps) for d in (64, 128, 256) for ps in (0, 1, 16, 256)]
    + [dict(d=128, page_size=0, snew=0, rotary=False, causal=False),  # no append
       dict(d=128, page_size=16, dtype=torch.float16),
       dict(d=64, page_size=0, sq=4, snew=4, interleaved=False),  # speculative tokens
       dict(d=128, page_size=256, sq=40, snew=40),  # more query rows than the decode tile
       dict(d=128, page_size=16, num_splits=7),  # split-KV forced
       dict(d=256, page_size=0, num_splits=1, heads=4, heads_k=4),  # unsplit, no GQA
       dict(d=128, page_size=1, num_splits=32, heads=8, heads_k=1)]  # MQA, many splits
)


@pytest.mark.parametrize("kw", CUDA_CACHE_CASES, ids=lambda kw: "-".join(f"{k}{v}" for k, v in kw.items()))
def test_cuda_fp8_kvcache_matches_cpu_append_and_reference(kw):
    dev = _cuda_or_skip()
    c = _cuda_cache_case(**kw)
    if kw["d"] not in CUDA_FP8_CACHE_HEAD_DIMS:
        # Built only where it has run on a GPU: elsewhere a clear error, not a fallback (on a
        # build trimmed of that head dim, the error says it was not built).
        with pytest.raises(NotImplementedError, match=f"head_dim {kw['d']} (with a float8_e4m3|was not built)"):
            _run_cache_on(c, dev)
        return
    out, kc, vc = _run_cache_on(c, dev)
    out_cpu, kc_cpu, vc_cpu = _run_cache_on(c, torch.device("cpu"))
    # The append is bitwise the CPU backend's: e4m3(x / descale) after rotary, RNE, saturating.
    assert torch.equal(kc, kc_cpu)
    assert torch.equal(vc, vc_cpu)
    lens, snew = c["cache_seqlens"], (c["k"].shape[1] if c["k"] is not None else 0)
    kd, vd, q = c["k_descale"], c["v_descale"], c["q"]
    dt = q.dtype
    for b in range(q.shape[0]):
        n = int(lens[b]) + snew
        kf = kc[b:b + 1, :n].view(FP8).double() * kd[b][None, None, :, None].double()
        vf = vc[b:b + 1, :n].view(FP8).double() * vd[b][None, None, :, None].double()
        qf = q[b].double()
        if c["cos"] is not None:  # q rotated at its positions, stored in q's dtype
            qf = torch.stack([_rotate_ref(qf[t], c["cos"], c["sin"], int(lens[b]) + (t if c["causal"] else 0),
                                          c["interleaved"]).to(dt).double() for t in range(q.shape[1])])
        ref, _ = attn_ref.forward(qf[None].numpy(), kf.numpy(), vf.numpy(), causal=c["causal"])
        # q's dtype: output rounding and P rounded to 16 bits before P.V (as the CPU backend).
        tol = 2 ** -7 if dt == torch.bfloat16 else 2 ** -10
        atol = 4 * tol * np.abs(ref).max()
        np.testing.assert_allclose(out[b:b + 1].double().numpy(), ref, rtol=tol, atol=atol)
        np.testing.assert_allclose(out[b:b + 1].double().numpy(), out_cpu[b:b + 1].double().numpy(),
                                   rtol=tol, atol=atol)


def test_cuda_fp8_kvcache_head_dim_without_kernels():
    dev = _cuda_or_skip()
    q = torch.randn(2, 1, 4, 96, device=dev, dtype=torch.bfloat16)
    kc = torch.randn(2, 256, 2, 96, device=dev).to(FP8)
    with pytest.raises(NotImplementedError, match="head_dim 96 with a float8_e4m3 k_cache/v_cache"):
        flashattn.flash_attn_with_kvcache(q, kc, kc.clone(), cache_seqlens=100)
