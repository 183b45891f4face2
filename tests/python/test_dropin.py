"""flash_attn drop-in edges on the CPU backend through numpy (issue 16): causal with a window,
non-finite inputs propagated as torch's SDPA (math backend) propagates them, empty tensors,
and the varlen metadata checks. The torch and CUDA variants live in test_torch.py and
test_cuda.py."""

import numpy as np
import pytest

import attn_ref
import flashattn

RNG = np.random.default_rng(20261216)


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def qkv(b=2, sq=70, sk=70, h=2, hk=1, d=32):
    return randn(b, sq, h, d), randn(b, sk, hk, d), randn(b, sk, hk, d)


# ---- causal with a window ---------------------------------------------------------------------

@pytest.mark.parametrize("window", [(5, 5), (-1, -1), (16, 3), (0, 7)])
def test_causal_with_window_is_the_left_window(window):
    # flash_attn 2.x: causal=True sets the right side of the window to 0.
    q, k, v = qkv(sq=40, sk=57)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, window_size=window,
                                            return_attn_probs=True)
    left_out, left_lse, _ = flashattn.flash_attn_func(q, k, v, window_size=(window[0], 0),
                                                      return_attn_probs=True)
    np.testing.assert_array_equal(out, left_out)
    np.testing.assert_array_equal(lse, left_lse)
    ref_out, _ = attn_ref.forward(q, k, v, window=(window[0], 0))
    low_out, _ = attn_ref.forward(q, k, v, window=(window[0], 0), dtype=np.float32)
    attn_ref.assert_fa_close("out", out, ref_out, low_out, 1e-5)


# ---- non-finite inputs ------------------------------------------------------------------------

def torch_math_sdpa(q, k, v, causal):
    """What torch's math SDPA computes, with IEEE semantics kept (no guard against NaN): scores,
    masked_fill(-inf), softmax as exp(s - max) / sum (a NaN or +inf among a row's visible scores
    makes the row NaN), rows whose scores are all -inf give 0 (torch's _safe_softmax), then P.V."""
    h = q.shape[2]
    k = np.repeat(k, h // k.shape[2], axis=2).astype(np.float64)
    v = np.repeat(v, h // v.shape[2], axis=2).astype(np.float64)
    with np.errstate(all="ignore"):
        s = np.einsum("bihd,bjhd->bhij", q.astype(np.float64), k) * q.shape[-1] ** -0.5
        s = np.where(attn_ref.visible(q.shape[1], k.shape[1], causal), s, -np.inf)
        m = s.max(axis=-1, keepdims=True)
        all_masked = np.isneginf(m)
        e = np.exp(s - np.where(all_masked, 0, m))
        p = np.where(all_masked, 0, e / e.sum(axis=-1, keepdims=True))
        return np.einsum("bhij,bjhd->bihd", p, v)


def poison(kind, q, k, v, b=1, i=10, c=3):
    q, k, v = q.copy(), k.copy(), v.copy()
    if kind == "nan_q":
        q[b, i, 1, c] = np.nan
    elif kind == "nan_k":
        k[b, i, 0, c] = np.nan
    elif kind == "nan_v":
        v[b, i, 0, c] = np.nan
    elif kind == "inf_k":
        k[b, i, 0, c] = np.inf
    return q, k, v


@pytest.mark.parametrize("kind", ["nan_q", "nan_k", "nan_v", "inf_k"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_non_finite_inputs_propagate_like_torch(kind, dtype):
    """Per row and head, the output is non-finite exactly where torch's math SDPA's is. NaN in
    v: only rows that see the poisoned key are compared (torch's math backend also turns the
    others NaN, through 0 * NaN in P.V; a kernel that skips invisible blocks does not)."""
    q, k, v = (t.astype(dtype) for t in qkv())
    q, k, v = poison(kind, q, k, v)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    expected = torch_math_sdpa(q, k, v, causal=True)
    row_bad = ~np.isfinite(expected).all(axis=-1)          # (b, sq, h)
    ours_bad = ~np.isfinite(out.astype(np.float64)).all(axis=-1)
    assert row_bad.any(), "the poisoned input must reach some row"
    decided = np.ones_like(row_bad)
    if kind == "nan_v":
        sees = np.zeros_like(row_bad)
        sees[1, 10:] = True  # batch 1, rows that see key 10 under causal, both heads
        decided = sees | (np.arange(2)[:, None, None] != 1)
    np.testing.assert_array_equal(ours_bad[decided], row_bad[decided])
    # LSE: NaN exactly on the NaN rows (it does not depend on v).
    lse_bad = np.isnan(lse.transpose(0, 2, 1))
    if kind == "nan_v":
        assert not lse_bad.any()
    else:
        np.testing.assert_array_equal(lse_bad, row_bad)
    # The finite rows are right (the poison does not leak into them).
    good = decided & ~row_bad
    np.testing.assert_allclose(out.astype(np.float64)[good], expected[good],
                               atol=2e-3 if dtype == np.float16 else 1e-5)


def test_fully_masked_rows_still_give_zero_and_minus_inf():
    q, k, v = qkv(b=1, sq=9, sk=4)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert np.all(out[:, :5] == 0) and np.all(np.isneginf(lse[:, :, :5]))
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(lse[:, :, 5:]))


def test_nan_query_row_gives_nan_gradient_row():
    q, k, v = qkv()
    q, k, v = poison("nan_q", q, k, v)
    out = np.empty_like(q)
    lse = np.empty((2, 2, 70), dtype=np.float32)
    flashattn.forward(q, k, v, out, lse, causal=True)
    dout = randn(*out.shape)
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    flashattn.backward(dout, q, k, v, out, lse, dq, dk, dv, causal=True)
    bad = ~np.isfinite(dq).all(axis=-1)
    expected = np.zeros_like(bad)
    expected[1, 10, 1] = True
    np.testing.assert_array_equal(bad, expected)
    assert np.isnan(dv[1, :11]).any(axis=-1).all() and np.isnan(dk[1, :11]).any(axis=-1).all()
    assert np.isfinite(dk[0]).all() and np.isfinite(dv[0]).all()


# ---- empty tensors ----------------------------------------------------------------------------

def zero_strided(shape, dtype=np.float32):
    """An empty array with every stride 0, as some DLPack exporters hand them over."""
    return np.lib.stride_tricks.as_strided(np.zeros(1, dtype=dtype), shape, (0,) * len(shape))


@pytest.mark.parametrize("b,sq,sk", [(0, 5, 7), (2, 0, 7), (2, 5, 0), (0, 0, 0)])
@pytest.mark.parametrize("zero_strides", [False, True])
def test_empty_tensors(b, sq, sk, zero_strides):
    h, hk, d = 4, 2, 16
    make = zero_strided if zero_strides else (lambda s: np.ones(s, dtype=np.float32))
    q = make((b, sq, h, d)) if b * sq == 0 else np.ones((b, sq, h, d), np.float32)
    k = make((b, sk, hk, d)) if b * sk == 0 else np.ones((b, sk, hk, d), np.float32)
    v = make((b, sk, hk, d)) if b * sk == 0 else np.ones((b, sk, hk, d), np.float32)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.shape == (b, sq, h, d) and lse.shape == (b, h, sq)
    assert np.all(out == 0) and np.all(np.isneginf(lse))
    dout = np.ones_like(out)
    dq, dk, dv = (np.full(t.shape, np.nan, np.float32) for t in (q, k, v))
    flashattn.backward(dout, q, k, v, out, lse, dq, dk, dv, causal=True)
    for g in (dq, dk, dv):
        assert np.all(g == 0)


def test_varlen_with_empty_sides():
    h, d = 2, 16
    q = randn(6, h, d)
    k = np.zeros((0, h, d), np.float32)
    cu_q = np.array([0, 2, 6], np.int32)
    cu_k = np.array([0, 0, 0], np.int32)
    out, lse, _ = flashattn.flash_attn_varlen_func(q, k, k, cu_q, cu_k, 4, 0,
                                                   return_attn_probs=True)
    assert np.all(out == 0) and np.all(np.isneginf(lse))
    empty_q = np.zeros((0, h, d), np.float32)
    out = flashattn.flash_attn_varlen_func(empty_q, q, q, cu_k, cu_q, 0, 4)
    assert out.shape == (0, h, d)


# ---- varlen metadata --------------------------------------------------------------------------

BAD_METADATA = [
    ("past_the_tensor", [0, 4, 4, 11], [0, 6, 9, 14], 6, 6, r"cu_seqlens_q\[batch\] = 11 exceeds the 10 rows of q"),
    ("non_monotone", [0, 4, 4, 10], [0, 6, 3, 14], 6, 6, "cu_seqlens_k must be non-decreasing"),
    ("max_too_small", [0, 4, 4, 10], [0, 6, 9, 14], 6, 5, "max_seqlen_k is 5 but cu_seqlens_k holds a sequence of length 6"),
]


@pytest.mark.parametrize("name,cu_q,cu_k,max_q,max_k,message", BAD_METADATA,
                         ids=[m[0] for m in BAD_METADATA])
def test_varlen_metadata_errors_name_the_problem(name, cu_q, cu_k, max_q, max_k, message):
    q, k = randn(10, 2, 16), randn(14, 2, 16)
    cu_q, cu_k = np.array(cu_q, np.int32), np.array(cu_k, np.int32)
    with pytest.raises(ValueError, match=message):
        flashattn.flash_attn_varlen_func(q, k, k, cu_q, cu_k, max_q, max_k)
    with pytest.raises(ValueError, match=message):
        flashattn.check_varlen_metadata(cu_q, cu_k, 10, 14, max_q, max_k)
    with pytest.raises(ValueError, match=message):
        flashattn.flash_attn_varlen_func(q, k, k, cu_q, cu_k, max_q, max_k, check_cu_seqlens=True)


def test_check_cu_seqlens_env_var_is_read_once_at_import():
    import subprocess
    import sys
    code = ("import flashattn._lowlevel as l, os; os.environ['FLASHATTN_CHECK_CU_SEQLENS'] = '0';"
            "print(l.CHECK_CU_SEQLENS)")
    for value, expected in (("1", "True"), ("0", "False"), ("", "False")):
        env = dict(__import__("os").environ, FLASHATTN_CHECK_CU_SEQLENS=value)
        result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                                text=True, check=True)
        assert result.stdout.strip() == expected
