"""The package without torch: numpy arrays on the CPU backend, through the flash_attn-style
functions (forward only) and the low-level forward/backward with preallocated outputs."""

import numpy as np
import pytest

import attn_ref
import flashattn

RNG = np.random.default_rng(20261129)

# Ragged shapes: nothing a multiple of a tile, seqlen 1, seqlen_q != seqlen_k, GQA and MQA,
# head_dim_v != head_dim.
SHAPES = [
    dict(b=2, sq=17, sk=17, h=4, hk=4, d=32, dv=32),
    dict(b=1, sq=1, sk=33, h=2, hk=1, d=16, dv=16),
    dict(b=2, sq=9, sk=5, h=4, hk=2, d=8, dv=8),
    dict(b=3, sq=23, sk=41, h=6, hk=2, d=40, dv=24),
]
OPTIONS = [
    dict(),
    dict(causal=True),
    dict(window=(3, 2)),
    dict(window=(-1, 4)),
    dict(softcap=5.0),
    dict(alibi="heads"),
    dict(alibi="batch_heads", causal=True),
    dict(scale=0.3, softcap=2.0, window=(4, 0)),
]
ATOL = {np.float32: 1e-5, np.float16: 2e-3}


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def make_inputs(s, dtype=np.float32):
    q = randn(s["b"], s["sq"], s["h"], s["d"], dtype=dtype)
    k = randn(s["b"], s["sk"], s["hk"], s["d"], dtype=dtype)
    v = randn(s["b"], s["sk"], s["hk"], s["dv"], dtype=dtype)
    return q, k, v


def alibi_for(kind, b, h):
    if kind is None:
        return None
    shape = (h,) if kind == "heads" else (b, h)
    return (RNG.uniform(0.05, 0.5, size=shape)).astype(np.float32)


def call_kwargs(opt, alibi):
    """flash_attn-style keyword arguments for an OPTIONS entry."""
    return dict(causal=opt.get("causal", False), window_size=opt.get("window", (-1, -1)),
                softcap=opt.get("softcap", 0.0), softmax_scale=opt.get("scale"),
                alibi_slopes=alibi)


def ref_kwargs(opt, alibi):
    return dict(causal=opt.get("causal", False), window=opt.get("window", (-1, -1)),
                softcap=opt.get("softcap", 0.0), scale=opt.get("scale"), alibi=alibi)


# ---- values ---------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{b}_sq{sq}_sk{sk}_h{h}_hk{hk}_d{d}_dv{dv}".format(**s))
@pytest.mark.parametrize("opt", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()) or "plain")
def test_forward_matches_reference(shape, opt):
    q, k, v = make_inputs(shape)
    alibi = alibi_for(opt.get("alibi"), shape["b"], shape["h"])
    out, lse, s_dmask = flashattn.flash_attn_func(q, k, v, return_attn_probs=True,
                                                  **call_kwargs(opt, alibi))
    assert s_dmask is None
    assert out.dtype == np.float32 and lse.dtype == np.float32
    assert out.shape == (shape["b"], shape["sq"], shape["h"], shape["dv"])
    assert lse.shape == (shape["b"], shape["h"], shape["sq"])
    ref_out, ref_lse = attn_ref.forward(q, k, v, **ref_kwargs(opt, alibi))
    low_out, low_lse = attn_ref.forward(q, k, v, dtype=np.float32, **ref_kwargs(opt, alibi))
    attn_ref.assert_fa_close("out", out, ref_out, low_out, ATOL[np.float32])
    attn_ref.assert_fa_close("lse", lse, ref_lse, low_lse, ATOL[np.float32])


def test_rows_without_keys_give_zero_and_minus_inf():
    # Causal with seqlen_q > seqlen_k: the first queries see no key.
    q, k, v = make_inputs(dict(b=1, sq=7, sk=3, h=2, hk=2, d=16, dv=16))
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert np.all(out[:, :4] == 0)
    assert np.all(np.isneginf(lse[:, :, :4]))
    assert np.all(np.isfinite(lse[:, :, 4:]))


def test_float16():
    s = dict(b=2, sq=19, sk=27, h=4, hk=2, d=32, dv=32)
    q, k, v = make_inputs(s, dtype=np.float16)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.dtype == np.float16
    ref_out, ref_lse = attn_ref.forward(q, k, v, causal=True)
    low_out, low_lse = attn_ref.forward(q, k, v, causal=True, dtype=np.float16)
    attn_ref.assert_fa_close("out", out, ref_out, low_out, ATOL[np.float16])
    attn_ref.assert_fa_close("lse", lse, ref_lse, low_lse, ATOL[np.float16])


# ---- low-level API: backward ----------------------------------------------------------------

def lowlevel_grads(q, k, v, dout, deterministic=False, **kw):
    out = np.empty(q.shape[:-1] + v.shape[-1:], dtype=q.dtype)
    lse = np.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=np.float32)
    flashattn.forward(q, k, v, out, lse, **kw)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    flashattn.backward(dout, q, k, v, out, lse, dq, dk, dv, deterministic=deterministic, **kw)
    return out, lse, dq, dk, dv


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{b}_sq{sq}_sk{sk}_h{h}_hk{hk}".format(**s))
@pytest.mark.parametrize("opt", OPTIONS[:6] + OPTIONS[7:], ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()) or "plain")
def test_lowlevel_backward_matches_reference(shape, opt):
    q, k, v = make_inputs(shape)
    dout = randn(shape["b"], shape["sq"], shape["h"], shape["dv"])
    alibi = alibi_for(opt.get("alibi"), shape["b"], shape["h"])
    kw = call_kwargs(opt, alibi)
    _, _, dq, dk, dv = lowlevel_grads(q, k, v, dout, **kw)
    ref = attn_ref.backward(dout, q, k, v, **ref_kwargs(opt, alibi))
    low = attn_ref.backward(dout, q, k, v, dtype=np.float32, **ref_kwargs(opt, alibi))
    for name, ours, r, lo in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, low):
        attn_ref.assert_fa_close(name, ours, r, lo, 1e-4)


def test_lowlevel_deterministic_is_bitwise_reproducible():
    s = dict(b=2, sq=31, sk=45, h=4, hk=1, d=32, dv=32)
    q, k, v = make_inputs(s)
    dout = randn(s["b"], s["sq"], s["h"], s["dv"])
    first = lowlevel_grads(q, k, v, dout, causal=True, deterministic=True)
    second = lowlevel_grads(q, k, v, dout, causal=True, deterministic=True)
    for a, b in zip(first, second):
        assert np.array_equal(a, b)


def test_lowlevel_without_lse_and_threads():
    q, k, v = make_inputs(SHAPES[0])
    out1 = np.empty_like(q)
    flashattn.forward(q, k, v, out1)  # lse is optional
    out2 = np.empty_like(q)
    flashattn.forward(q, k, v, out2, None, num_threads=1)
    assert np.array_equal(out1, out2)


# ---- layouts: strided views, varlen, packed -------------------------------------------------

def test_noncontiguous_inputs_and_outputs():
    b, sq, sk, h, d = 2, 13, 21, 4, 32
    # q, k, v as (b, h, s, d) tensors transposed to (b, s, h, d); k, v slices of a wider buffer.
    q = randn(b, h, sq, d).transpose(0, 2, 1, 3)
    kbuf = randn(b, sk, 2 * h, d)
    k = kbuf[:, :, ::2]
    v = randn(b, sk + 5, h, d)[:, 3:3 + sk]
    assert not q.flags.c_contiguous and not k.flags.c_contiguous and not v.flags.c_contiguous
    out_buf = np.zeros((b, h, sq, d), dtype=np.float32)
    out = out_buf.transpose(0, 2, 1, 3)
    lse_buf = np.zeros((b, h, sq + 3), dtype=np.float32)
    lse = lse_buf[:, :, 2:2 + sq]
    flashattn.forward(q, k, v, out, lse, causal=True)
    ref_out, ref_lse = attn_ref.forward(q, k, v, causal=True)
    low_out, low_lse = attn_ref.forward(q, k, v, causal=True, dtype=np.float32)
    attn_ref.assert_fa_close("out", out_buf.transpose(0, 2, 1, 3), ref_out, low_out, 1e-5)
    attn_ref.assert_fa_close("lse", lse_buf[:, :, 2:2 + sq], ref_lse, low_lse, 1e-5)
    # The same through the flash_attn-style function, against contiguous copies.
    out_fn = flashattn.flash_attn_func(q, k, v, causal=True)
    out_c = flashattn.flash_attn_func(*(np.ascontiguousarray(t) for t in (q, k, v)), causal=True)
    assert np.array_equal(out_fn, out_c)


def varlen_pack(seqs):
    """Concatenates per-sequence (1, s, h, d) arrays into (total, h, d) and cu_seqlens."""
    lens = [t.shape[1] for t in seqs]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    return np.concatenate([t[0] for t in seqs], axis=0), cu


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_matches_per_sequence(causal):
    lens_q, lens_k = [5, 1, 17, 0, 9], [7, 4, 17, 3, 2]
    h, hk, d = 4, 2, 16
    qs = [randn(1, n, h, d) for n in lens_q]
    ks = [randn(1, n, hk, d) for n in lens_k]
    vs = [randn(1, n, hk, d) for n in lens_k]
    q, cu_q = varlen_pack(qs)
    k, cu_k = varlen_pack(ks)
    v, _ = varlen_pack(vs)
    out, lse, _ = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                                   causal=causal, return_attn_probs=True)
    assert out.shape == (sum(lens_q), h, d) and lse.shape == (h, sum(lens_q))
    for i in range(len(lens_q)):
        if lens_q[i] == 0:
            continue
        o_i, l_i, _ = flashattn.flash_attn_func(qs[i], ks[i], vs[i], causal=causal,
                                                return_attn_probs=True)
        sl = slice(cu_q[i], cu_q[i + 1])
        np.testing.assert_allclose(out[sl], o_i[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(lse[:, sl], l_i[0], rtol=1e-5, atol=1e-6)

    # Backward through the low-level API, per sequence.
    dout = randn(*out.shape)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    flashattn.backward(dout, q, k, v, out, lse, dq, dk, dv, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                       max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k), causal=causal)
    for i in range(len(lens_q)):
        sq, sk = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        ref = attn_ref.backward(dout[sq][None], qs[i], ks[i], vs[i], causal=causal)
        for ours, r in zip((dq[sq], dk[sk], dv[sk]), ref):
            np.testing.assert_allclose(ours, r[0], rtol=1e-4, atol=1e-5)


def test_packed_match_unpacked():
    b, s, h, d = 2, 19, 4, 32
    qkv = randn(b, s, 3, h, d)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    ref = flashattn.flash_attn_func(q.copy(), k.copy(), v.copy(), causal=True)
    np.testing.assert_array_equal(flashattn.flash_attn_qkvpacked_func(qkv, causal=True), ref)
    kv = np.ascontiguousarray(qkv[:, :, 1:])
    np.testing.assert_array_equal(flashattn.flash_attn_kvpacked_func(q, kv, causal=True), ref)

    cu = np.arange(0, (b + 1) * s, s, dtype=np.int32)
    qkv_v = qkv.reshape(b * s, 3, h, d)
    out_v = flashattn.flash_attn_varlen_qkvpacked_func(qkv_v, cu, s, causal=True)
    np.testing.assert_allclose(out_v, ref.reshape(b * s, h, d), rtol=1e-6, atol=1e-6)
    out_kv = flashattn.flash_attn_varlen_kvpacked_func(q.reshape(b * s, h, d), kv.reshape(b * s, 2, h, d),
                                                       cu, cu, s, s, causal=True)
    np.testing.assert_allclose(out_kv, ref.reshape(b * s, h, d), rtol=1e-6, atol=1e-6)


# ---- dropout --------------------------------------------------------------------------------

def keep_mask(b, h, sq, sk, p, seed, offset=0):
    """Reads the dropout keep mask (b, h, sq, sk) of (seed, offset) back from the library:
    q = 0 makes every score equal, so with v = identity out[b, i, h, j] = keep / (sk (1 - p))."""
    q = np.zeros((b, sq, h, 8), dtype=np.float32)
    k = randn(b, sk, h, 8)
    v = np.zeros((b, sk, h, sk), dtype=np.float32)
    v[:, np.arange(sk), :, np.arange(sk)] = 1.0
    out = np.empty((b, sq, h, sk), dtype=np.float32)
    flashattn.forward(q, k, v, out, dropout_p=p, seed=seed, offset=offset)
    kept = out > 0
    np.testing.assert_allclose(out[kept], 1.0 / (sk * (1 - p)), rtol=1e-5)
    return kept.transpose(0, 2, 1, 3)


def test_dropout_same_seed_same_result_and_keep_rate():
    s = dict(b=2, sq=37, sk=53, h=4, hk=2, d=32, dv=32)
    q, k, v = make_inputs(s)
    runs = {}
    for seed in (1234, 1234, 99):
        out = np.empty_like(q)
        flashattn.forward(q, k, v, out, dropout_p=0.3, seed=seed)
        runs.setdefault(seed, []).append(out)
    assert np.array_equal(runs[1234][0], runs[1234][1])
    assert not np.array_equal(runs[1234][0], runs[99][0])
    offset_out = np.empty_like(q)
    flashattn.forward(q, k, v, offset_out, dropout_p=0.3, seed=1234, offset=1)
    assert not np.array_equal(runs[1234][0], offset_out)

    for p in (0.1, 0.5):
        kept = keep_mask(2, 4, 64, 64, p, seed=7)
        n = kept.size
        rate = kept.mean()
        assert abs(rate - (1 - p)) < 5 * np.sqrt(p * (1 - p) / n), f"keep rate {rate} for p={p}"


def test_dropout_forward_and_backward_match_reference_with_the_same_mask():
    s = dict(b=2, sq=21, sk=29, h=4, hk=2, d=16, dv=16)
    p, seed = 0.25, 31337
    keep = keep_mask(s["b"], s["h"], s["sq"], s["sk"], p, seed)
    q, k, v = make_inputs(s)
    dout = randn(s["b"], s["sq"], s["h"], s["dv"])
    out, lse, dq, dk, dv = lowlevel_grads(q, k, v, dout, causal=True, dropout_p=p, seed=seed)
    kw = dict(causal=True, dropout_p=p, keep=keep)
    ref_out, _ = attn_ref.forward(q, k, v, **kw)
    low_out, _ = attn_ref.forward(q, k, v, dtype=np.float32, **kw)
    attn_ref.assert_fa_close("out", out, ref_out, low_out, 1e-5)
    ref = attn_ref.backward(dout, q, k, v, **kw)
    low = attn_ref.backward(dout, q, k, v, dtype=np.float32, **kw)
    for name, ours, r, lo in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, low):
        attn_ref.assert_fa_close(name, ours, r, lo, 1e-4)


# ---- package surface ------------------------------------------------------------------------

def test_package_surface():
    assert isinstance(flashattn.__version__, str) and flashattn.__version__.count(".") == 2
    assert isinstance(flashattn.cuda_available(), bool)
    assert isinstance(flashattn.cuda_built(), bool)
    if not flashattn.cuda_built():
        assert not flashattn.cuda_available()
    for name in ("flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
                 "flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func",
                 "flash_attn_varlen_kvpacked_func", "forward", "backward"):
        assert callable(getattr(flashattn, name))
    assert callable(flashattn.flash_attn_with_kvcache) and callable(flashattn.forward_kvcache)
    from flashattn.flash_attn_interface import flash_attn_func
    assert flash_attn_func is flashattn.flash_attn_func
