"""Every bad-input path raises the documented exception with a message naming the argument:
TypeError for dtype problems, ValueError for other invalid arguments, NotImplementedError for
valid requests this build cannot run."""

import shutil
import subprocess
import sys

import numpy as np
import pytest

import flashattn

RNG = np.random.default_rng(7)


def randn(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def qkv(b=2, sq=8, sk=8, h=4, hk=4, d=16, dtype=np.float32):
    return randn(b, sq, h, d, dtype=dtype), randn(b, sk, hk, d, dtype=dtype), randn(b, sk, hk, d, dtype=dtype)


def low_forward(q, k, v, out=None, lse=None, **kw):
    if out is None:
        out = np.empty(q.shape[:-1] + v.shape[-1:], dtype=q.dtype)
    flashattn.forward(q, k, v, out, lse, **kw)


# ---- dtype -> TypeError ---------------------------------------------------------------------

def test_float64_q_is_a_type_error_naming_q():
    q, k, v = qkv(dtype=np.float64)
    with pytest.raises(TypeError, match=r"\bq\b.*float64"):
        flashattn.flash_attn_func(q, k, v)


def test_mixed_dtypes_name_the_odd_argument():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"\bk\b.*dtype"):
        flashattn.flash_attn_func(q, k.astype(np.float16), v)
    with pytest.raises(TypeError, match=r"\bv\b.*dtype"):
        flashattn.flash_attn_func(q, k, v.astype(np.float16))


def test_unsupported_dtypes_name_the_argument():
    q, k, v = qkv()
    for bad in (np.int64, np.int32, np.complex64, np.bool_):
        with pytest.raises(TypeError, match=r"\bq\b"):
            flashattn.flash_attn_func(q.astype(bad), k, v)


def test_output_dtypes():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"\bout\b.*dtype"):
        low_forward(q, k, v, out=np.empty(q.shape, dtype=np.float16))
    with pytest.raises(TypeError, match=r"\blse\b.*float64"):
        low_forward(q, k, v, lse=np.empty((2, 4, 8), dtype=np.float64))


def test_cu_seqlens_and_alibi_dtypes():
    q, k, v = (t.reshape(16, 4, 16) for t in qkv())
    cu = np.array([0, 8, 16], dtype=np.int32)
    with pytest.raises(TypeError, match="cu_seqlens_q"):
        flashattn.flash_attn_varlen_func(q, k, v, cu.astype(np.int64), cu, 8, 8)
    with pytest.raises(TypeError, match="cu_seqlens_k.*int32"):
        flashattn.flash_attn_varlen_func(q, k, v, cu, cu.astype(np.float32), 8, 8)
    q4, k4, v4 = qkv()
    with pytest.raises(TypeError, match="alibi_slopes"):
        flashattn.flash_attn_func(q4, k4, v4, alibi_slopes=np.ones(4, dtype=np.float64))
    with pytest.raises(TypeError, match="alibi_slopes.*float32"):
        flashattn.flash_attn_func(q4, k4, v4, alibi_slopes=np.ones(4, dtype=np.float16))


def test_not_an_array_is_a_type_error():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"\bk\b.*list"):
        flashattn.forward(q, k.tolist(), v, np.empty_like(q))
    with pytest.raises(TypeError, match=r"\bq\b"):
        flashattn.flash_attn_func("q", k, v)


# ---- shapes, strides, options -> ValueError -------------------------------------------------

def test_wrong_rank_names_q():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"\bq\b.*4 dimensions"):
        flashattn.flash_attn_func(q[0], k, v)
    with pytest.raises(ValueError, match=r"\bq\b"):
        low_forward(np.float32(1.0), k, v, out=np.empty_like(q))
    with pytest.raises(ValueError, match=r"\bq\b.*dimensions"):
        low_forward(q[None], k, v, out=np.empty_like(q))


def test_shape_mismatches_name_the_argument():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"\bk\b.*head_dim"):
        flashattn.flash_attn_func(q, randn(2, 8, 4, 8), v)
    with pytest.raises(ValueError, match=r"\bv\b.*shape"):
        flashattn.flash_attn_func(q, k, randn(2, 9, 4, 16))
    with pytest.raises(ValueError, match=r"\bk\b.*batch"):
        flashattn.flash_attn_func(q, randn(3, 8, 4, 16), randn(3, 8, 4, 16))
    with pytest.raises(ValueError, match="heads"):
        flashattn.flash_attn_func(q, randn(2, 8, 3, 16), randn(2, 8, 3, 16))
    with pytest.raises(ValueError, match=r"\bout\b.*shape"):
        low_forward(q, k, v, out=np.empty((2, 8, 4, 8), dtype=np.float32))
    with pytest.raises(ValueError, match=r"\blse\b.*shape"):
        low_forward(q, k, v, lse=np.empty((2, 8, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="alibi_slopes"):
        flashattn.flash_attn_func(q, k, v, alibi_slopes=np.ones(3, dtype=np.float32))


def test_backward_arguments_are_named():
    q, k, v = qkv()
    out, lse = np.empty_like(q), np.empty((2, 4, 8), dtype=np.float32)
    flashattn.forward(q, k, v, out, lse)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    with pytest.raises(ValueError, match=r"\bdout\b"):
        flashattn.backward(out[:, :4], q, k, v, out, lse, dq, dk, dv)
    with pytest.raises(ValueError, match=r"\bdk\b"):
        flashattn.backward(out, q, k, v, out, lse, dq, dk[:, :4], dv)
    with pytest.raises(TypeError, match=r"\bdv\b.*dtype"):
        flashattn.backward(out, q, k, v, out, lse, dq, dk, dv.astype(np.float16))
    with pytest.raises(ValueError, match=r"\blse\b.*required"):
        flashattn.backward(out, q, k, v, out, None, dq, dk, dv)


def test_strides():
    q, k, v = qkv(d=32)
    with pytest.raises(ValueError, match=r"\bq\b.*contiguous in its last dimension"):
        flashattn.flash_attn_func(q[..., ::2], k[..., ::2], v[..., ::2])
    with pytest.raises(ValueError, match=r"\bk\b.*negative stride"):
        flashattn.flash_attn_func(q, k[:, ::-1], v)


def test_read_only_output():
    q, k, v = qkv()
    out = np.empty_like(q)
    out.flags.writeable = False
    with pytest.raises(ValueError, match=r"\bout\b.*read-only"):
        flashattn.forward(q, k, v, out)
    # Read-only inputs are fine.
    for t in (q, k, v):
        t.flags.writeable = False
    flashattn.flash_attn_func(q, k, v)


def test_refused_dlpack_export_names_the_argument_and_the_reason():
    class Refuses:
        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, *args, **kwargs):
            raise BufferError("this producer never exports")

    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"\bk\b could not be exported by DLPack: this producer never exports"):
        low_forward(q, Refuses(), v, out=np.empty_like(q))


def test_many_errors_in_one_process():
    # On the GPU machine image the extension segfaulted at the first error message built with
    # std::ostringstream (its static libstdc++ was exported and half-interposed by the process's
    # libstdc++.so; see test_extension_exports_only_its_entry_point); every kind of error,
    # repeatedly.
    q, k, v = qkv()
    bad_calls = [
        (ValueError, lambda: flashattn.flash_attn_func(q, randn(2, 8, 4, 8), v)),
        (ValueError, lambda: flashattn.flash_attn_func(q, k, randn(2, 9, 4, 16))),
        (TypeError, lambda: flashattn.flash_attn_func(q, k, v.astype(np.float64))),
        (TypeError, lambda: low_forward(q, [1.0], v, out=np.empty_like(q))),
        (NotImplementedError, lambda: flashattn.flash_attn_func(randn(1, 4, 1, 1100), randn(1, 4, 1, 1100),
                                                                randn(1, 4, 1, 1100))),
    ]
    for _ in range(3):
        for kind, call in bad_calls:
            with pytest.raises(kind):
                call()
    assert np.isfinite(flashattn.flash_attn_func(q, k, v)).all()


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("nm") is None,
                    reason="needs Linux and binutils' nm")
def test_extension_exports_only_its_entry_point():
    # Anything else exported (static libstdc++ above all) can be interposed by another copy
    # loaded in the process; python/src/exports.map keeps the module closed.
    from flashattn import _C
    listing = subprocess.run(["nm", "-D", "--defined-only", _C.__file__], capture_output=True,
                             text=True, check=True).stdout
    exported = sorted(line.split()[-1] for line in listing.splitlines() if line.strip())
    assert exported == ["PyInit__C"], exported[:20]


def test_options():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="dropout_p"):
        flashattn.flash_attn_func(q, k, v, dropout_p=1.0)
    with pytest.raises(ValueError, match="window"):
        flashattn.flash_attn_func(q, k, v, window_size=(-2, 0))
    with pytest.raises(ValueError, match="window_size"):
        flashattn.flash_attn_func(q, k, v, window_size=3)
    with pytest.raises(ValueError, match="softmax_scale"):
        flashattn.flash_attn_func(q, k, v, softmax_scale=0.0)
    with pytest.raises(ValueError, match="softcap"):
        flashattn.flash_attn_func(q, k, v, softcap=-1.0)
    with pytest.raises(ValueError, match="num_threads"):
        low_forward(q, k, v, num_threads=-1)


def test_paged_kv_needs_pages():
    """block_table makes k and v pages (num_blocks, page_size, heads_k, head_dim): packed k and
    v are refused naming the layout (tests/python/test_paged_varlen.py runs the paged calls)."""
    q, k, v = (t.reshape(16, 4, 16) for t in qkv())
    cu = np.array([0, 8, 16], dtype=np.int32)
    with pytest.raises(ValueError, match=r"k must have 4 dimensions \(num_blocks, page_size"):
        flashattn.flash_attn_varlen_func(q, k, v, cu, cu, 8, 8,
                                         block_table=np.zeros((2, 1), dtype=np.int32))


def test_bad_cu_seqlens():
    q, k, v = (t.reshape(16, 4, 16) for t in qkv())
    good = np.array([0, 8, 16], dtype=np.int32)
    with pytest.raises(ValueError, match=r"cu_seqlens_q\[0\] must be 0"):
        flashattn.flash_attn_varlen_func(q, k, v, np.array([1, 8, 16], np.int32), good, 8, 8)
    with pytest.raises(ValueError, match="cu_seqlens_k.*non-decreasing"):
        flashattn.flash_attn_varlen_func(q, k, v, good, np.array([0, 9, 8], np.int32), 9, 8)
    with pytest.raises(ValueError, match="cu_seqlens_q.*exceeds"):
        flashattn.flash_attn_varlen_func(q, k, v, np.array([0, 8, 17], np.int32), good, 9, 8)
    with pytest.raises(ValueError, match="cu_seqlens_k must have 3 entries"):
        flashattn.flash_attn_varlen_func(q, k, v, good, good[:2], 8, 8)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        flashattn.flash_attn_varlen_func(q, k, v, good, good, 4, 8)
    with pytest.raises(ValueError, match=r"\bq\b.*3 dimensions"):
        flashattn.flash_attn_varlen_func(q[None], k, v, good, good, 8, 8)


# ---- valid but not runnable -> NotImplementedError -------------------------------------------

def test_head_dim_too_large_is_not_implemented():
    q, k, v = qkv(d=1100)
    with pytest.raises(NotImplementedError, match="head_dim"):
        flashattn.flash_attn_func(q, k, v)
    assert issubclass(NotImplementedError, RuntimeError)


def test_integers_outside_int32_are_value_errors_naming_the_argument():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"window_size\[1\].*int32"):
        flashattn.flash_attn_func(q, k, v, window_size=(0, 2**31))
    with pytest.raises(ValueError, match=r"num_threads.*int32"):
        low_forward(q, k, v, num_threads=2**40)
    with pytest.raises(ValueError, match=r"max_seqlen_q.*integer"):
        low_forward(q, k, v, max_seqlen_q="many")


def test_window_wider_than_the_sequence_equals_unbounded():
    q, k, v = qkv(sq=8, sk=8)
    wide = flashattn.flash_attn_func(q, k, v, window_size=(2**31 - 1, 2**31 - 1))
    full = flashattn.flash_attn_func(q, k, v)
    np.testing.assert_array_equal(wide, full)


# ---- found by the input-validation audit (each was a crash-free but wrong or unnamed outcome) ----

def test_softmax_scale_that_rounds_to_zero_in_float32_is_refused():
    # The library takes the scale in float32, where 0 means 1/sqrt(head_dim): 1e-50 silently ran
    # with the default scale.
    q, k, v = qkv()
    with pytest.raises(ValueError, match="softmax_scale = 1e-50 rounds to 0 in float32"):
        flashattn.flash_attn_func(q, k, v, softmax_scale=1e-50)
    tiny = flashattn.flash_attn_func(q, k, v, softmax_scale=2.0**-149)  # float32's smallest
    np.testing.assert_allclose(tiny, np.broadcast_to(v.mean(axis=1, keepdims=True), v.shape), atol=1e-5)
    torch = pytest.importorskip("torch")  # the torch calls' own host path reads the scale too
    tq, tk, tv = (torch.from_numpy(t) for t in (q, k, v))
    with pytest.raises(ValueError, match="softmax_scale = 1e-50 rounds to 0"):
        flashattn.flash_attn_func(tq, tk, tv, softmax_scale=1e-50)
    with pytest.raises(ValueError, match="softmax_scale = 1e-50 rounds to 0"):
        flashattn.flash_attn_with_kvcache(tq, tk, tv, softmax_scale=1e-50)


def test_block_size_of_the_wrong_form_names_block_size():
    q, k, v = qkv()
    mask = np.ones((1, 1, 2, 2), dtype=np.bool_)
    for bad in ((4,), (4, 4, 4), 4.0, "4"):
        with pytest.raises(ValueError, match="block_size must be an int or a pair"):
            flashattn.flash_attn_func(q, k, v, block_mask=mask, block_size=bad)


def test_scalar_options_of_the_wrong_type_are_named():
    q, k, v = qkv()
    for name, bad in (("softcap", None), ("softcap", "x"), ("dropout_p", None), ("dropout_p", "0.1")):
        with pytest.raises(TypeError, match=f"{name} must be a real number"):
            flashattn.flash_attn_func(q, k, v, **{name: bad})
    with pytest.raises(ValueError, match=r"window_size\[0\] must be an integer, got 1.5"):
        flashattn.flash_attn_func(q, k, v, window_size=(1.5, 0))  # int() truncated it to 1


def _torch():
    return pytest.importorskip("torch")


def test_torch_calls_name_arguments_that_are_not_tensors():
    # The eager routes skip the custom op's schema check; a list or numpy array where a tensor
    # belongs failed with an AttributeError deep inside instead.
    torch = _torch()
    q, k, v = (torch.from_numpy(t) for t in qkv())
    cu = torch.tensor([0, 8, 16], dtype=torch.int32)
    calls = [
        ("alibi_slopes", lambda: flashattn.flash_attn_func(q, k, v, alibi_slopes=[0.5] * 4)),
        ("attn_bias", lambda: flashattn.flash_attn_func(q, k, v, attn_bias=np.zeros((2, 4, 8, 8), np.float32))),
        (r"\bk\b", lambda: flashattn.flash_attn_func(q, k.numpy(), v.numpy())),
        ("q_descale", lambda: flashattn.flash_attn_func(q, k, v, q_descale=2.0)),
        ("cu_seqlens_q", lambda: flashattn.flash_attn_varlen_func(
            q.reshape(16, 4, 16), k.reshape(16, 4, 16), v.reshape(16, 4, 16), cu.tolist(), cu, 8, 8)),
        ("cache_seqlens", lambda: flashattn.flash_attn_with_kvcache(q[:, :1], k, v, cache_seqlens=[5, 7])),
    ]
    for name, call in calls:
        with pytest.raises(TypeError, match=name + ".* must be a torch.Tensor"):
            call()


def test_torch_calls_name_missing_and_low_rank_operands():
    torch = _torch()
    q, k, v = (torch.from_numpy(t) for t in qkv())
    cu = torch.tensor([0, 8, 16], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"\bv is required"):
        flashattn.flash_attn_func(q, k, None)
    with pytest.raises(ValueError, match=r"\bk is required"):
        flashattn.flash_attn_varlen_func(q.reshape(16, 4, 16), None, v.reshape(16, 4, 16), cu, cu, 8, 8)
    with pytest.raises(ValueError, match="v_cache is required"):
        flashattn.flash_attn_with_kvcache(q[:, :1], k, None, cache_seqlens=5)
    with pytest.raises(ValueError, match=r"\bq must have 4 dimensions"):
        flashattn.flash_attn_func(torch.tensor(1.0), k, v)
    with pytest.raises(ValueError, match="cu_seqlens_q must have 1 (to 4 )?dimensions"):
        flashattn.flash_attn_varlen_func(q.reshape(16, 4, 16), k.reshape(16, 4, 16), v.reshape(16, 4, 16),
                                         cu[0], cu[0], 8, 8)
    with pytest.raises(ValueError, match="cache_seqlens must fit in int32"):
        flashattn.flash_attn_with_kvcache(q[:, :1], k, v, cache_seqlens=2**40)


def test_block_mask_builders_name_their_arguments():
    torch = _torch()
    with pytest.raises(ValueError, match="block_size must be >= 1"):
        flashattn.block_mask_from_dense(torch.ones(1, 1, 2, 2, dtype=torch.bool), 0)
    with pytest.raises(ValueError, match="block_size must be >= 1"):  # was a ZeroDivisionError
        flashattn.block_mask_from_mask_mod(lambda b, h, i, j: i >= j, 1, 1, 8, 8, block_size=(4, 0), device="cpu")
    with pytest.raises(ValueError, match="block_mask must have 4 dimensions"):
        flashattn.block_mask_from_dense(torch.ones(2, 2, dtype=torch.bool), 4)
    q, k, v = (torch.from_numpy(t) for t in qkv())
    bm = flashattn.block_mask_from_dense(torch.ones(1, 1, 2, 2, dtype=torch.bool), 4)
    with pytest.raises(ValueError, match="BlockMask.mask must have at least 2 dimensions"):
        flashattn.flash_attn_func(q, k, v, block_mask=bm._replace(mask=torch.ones(8, dtype=torch.bool)))


def test_appending_into_a_cache_that_shares_memory_is_refused():
    # An expand()ed cache (stride 0) made the append's rows overwrite each other.
    torch = _torch()
    q = torch.randn(2, 1, 4, 16)
    k_cache = torch.randn(1, 16, 4, 16).expand(2, -1, -1, -1)
    v_cache = torch.randn(1, 16, 4, 16).expand(2, -1, -1, -1)
    new = torch.randn(2, 1, 4, 16)
    with pytest.raises(ValueError, match="k_cache is written by the call and must not have stride 0 in dimension 0"):
        flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, k=new, v=new, cache_seqlens=5)
    out = flashattn.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=5)  # read only: fine
    assert torch.isfinite(out).all()
