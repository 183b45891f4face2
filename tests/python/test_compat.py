"""The flash_attn import alias (flashattn.install_as_flash_attn) and the flash_attn 2.x helpers
it serves: bert_padding (unpad_input, pad_input, index_first_axis) and layers.rotary
(apply_rotary_emb, the in-place qkv / kv forms, the RotaryEmbedding module with XPos), checked on
the CPU against formulas written here (the rotary ones in float64). scripts/flash-attn-tests.sh
runs flash_attn's own test file through the alias on the GPU."""

import sys
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flashattn  # noqa: E402
from flashattn import compat  # noqa: E402
from flashattn.bert_padding import index_first_axis, pad_input, unpad_input  # noqa: E402
from flashattn.layers.rotary import apply_rotary_emb  # noqa: E402


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ---- the alias --------------------------------------------------------------------------------

@pytest.fixture
def clean_modules():
    """Removes the alias's names from sys.modules before and after a test, so each test sees a
    process where flash_attn was never imported."""
    def drop():
        for name in compat.ALIASES:
            sys.modules.pop(name, None)
    drop()
    yield
    drop()


# The import lines of flash_attn v2.8.3's tests/test_flash_attn.py, verbatim.
FLASH_ATTN_TEST_IMPORTS = """
from flash_attn import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
    flash_attn_with_kvcache,
)
from flash_attn.bert_padding import pad_input, unpad_input
from flash_attn.flash_attn_interface import _get_block_size_n
from flash_attn.layers.rotary import apply_rotary_emb
"""


def test_alias_serves_flashattn_modules(clean_modules):
    flashattn.install_as_flash_attn()
    names = {}
    exec(FLASH_ATTN_TEST_IMPORTS, names)
    for fn in ("flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func",
               "flash_attn_varlen_func", "flash_attn_varlen_kvpacked_func",
               "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache"):
        assert names[fn] is getattr(flashattn, fn)
    assert names["pad_input"] is pad_input and names["unpad_input"] is unpad_input
    assert names["apply_rotary_emb"] is apply_rotary_emb

    import flash_attn
    import flash_attn.layers.rotary
    assert flash_attn is flashattn
    assert flash_attn.layers.rotary.apply_rotary_emb is apply_rotary_emb
    assert flash_attn.bert_padding.index_first_axis is index_first_axis
    assert flash_attn.flash_attn_interface is flashattn.flash_attn_interface


def test_alias_is_idempotent(clean_modules):
    flashattn.install_as_flash_attn()
    flashattn.install_as_flash_attn()
    assert sys.modules["flash_attn"] is flashattn


def test_alias_leaves_the_rest_of_flash_attn_missing(clean_modules):
    flashattn.install_as_flash_attn()
    with pytest.raises(ModuleNotFoundError):
        import flash_attn.ops.triton.rotary  # noqa: F401


def test_alias_refuses_a_real_flash_attn_already_imported(clean_modules):
    sys.modules["flash_attn"] = types.ModuleType("flash_attn")
    with pytest.raises(RuntimeError, match="before anything imports flash_attn"):
        flashattn.install_as_flash_attn()
    assert "flash_attn.bert_padding" not in sys.modules


def test_block_size_helper_says_why_it_does_not_apply():
    from flashattn.flash_attn_interface import _get_block_size_n
    with pytest.raises(NotImplementedError, match="return_attn_probs"):
        _get_block_size_n("cuda", 64, True, False)
    q = torch.randn(1, 5, 2, 8, generator=gen())
    assert flashattn.flash_attn_func(q, q, q, return_attn_probs=True)[2] is None


# ---- bert_padding -----------------------------------------------------------------------------

def padding_mask(lengths, seqlen):
    return torch.arange(seqlen)[None, :] < torch.tensor(lengths)[:, None]


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64])
def test_unpad_pad_round_trip(mask_dtype):
    lengths, seqlen = [5, 0, 7, 3], 7
    mask = padding_mask(lengths, seqlen)
    # A hole in the middle of a row: unpad keeps the tokens the mask names, wherever they are.
    mask[3, 1] = False
    mask[3, 5] = True
    x = torch.randn(4, seqlen, 3, 2, generator=gen(1))
    rows, indices, cu_seqlens, max_seqlen, seqused = unpad_input(x, mask.to(mask_dtype))

    expect_rows, expect_indices = [], []
    for b in range(4):
        for s in range(seqlen):
            if mask[b, s]:
                expect_rows.append(x[b, s])
                expect_indices.append(b * seqlen + s)
    counts = mask.sum(1).tolist()
    assert torch.equal(rows, torch.stack(expect_rows))
    assert indices.dtype == torch.int64 and indices.tolist() == expect_indices
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.tolist() == list(np.cumsum([0] + counts))
    assert isinstance(max_seqlen, int) and max_seqlen == max(counts)
    assert seqused.dtype == torch.int32 and seqused.tolist() == counts

    padded = pad_input(rows, indices, 4, seqlen)
    assert torch.equal(padded, x * mask[:, :, None, None])


def test_unpad_with_unused_mask():
    mask = padding_mask([2, 3], 5)
    unused = padding_mask([4, 3], 5) & ~mask  # allocated but unused slots after each sequence
    x = torch.randn(2, 5, 4, generator=gen(2))
    rows, indices, cu_seqlens, max_seqlen, seqused = unpad_input(x, mask, unused)
    assert indices.tolist() == [0, 1, 2, 3, 5, 6, 7]
    assert cu_seqlens.tolist() == [0, 4, 7]
    assert max_seqlen == 4
    assert seqused.tolist() == [2, 3]
    assert torch.equal(rows, x.reshape(10, 4)[indices])


def test_padding_gradients():
    mask = padding_mask([3, 1], 4)
    x = torch.randn(2, 4, 2, 3, generator=gen(3), requires_grad=True)
    rows, indices, *_ = unpad_input(x, mask)
    g_rows = torch.randn(rows.shape, generator=gen(4))
    (dx,) = torch.autograd.grad(rows, x, g_rows)
    assert torch.equal(dx[mask], g_rows)
    assert not dx[~mask].any()

    r = rows.detach().requires_grad_()
    g_out = torch.randn(2, 4, 2, 3, generator=gen(5))
    (dr,) = torch.autograd.grad(pad_input(r, indices, 2, 4), r, g_out)
    assert torch.equal(dr, g_out[mask])


def test_index_first_axis():
    x = torch.randn(6, 2, 3, generator=gen(6), requires_grad=True)
    idx = torch.tensor([4, 0, 4, 2])
    out = index_first_axis(x, idx)
    assert torch.equal(out, x.detach()[idx])
    out.sum().backward()
    assert x.grad[:, 0, 0].tolist() == [1.0, 0.0, 1.0, 0.0, 2.0, 0.0]
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        index_first_axis(torch.zeros(3), idx[:1])


def test_unpad_empty_batch_and_bad_mask():
    rows, indices, cu_seqlens, max_seqlen, seqused = unpad_input(
        torch.zeros(0, 4, 2), torch.zeros(0, 4, dtype=torch.bool))
    assert rows.shape == (0, 2) and cu_seqlens.tolist() == [0] and max_seqlen == 0
    assert pad_input(rows, indices, 0, 4).shape == (0, 4, 2)
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        unpad_input(torch.zeros(2, 4, 3), torch.ones(2, 5, dtype=torch.bool))


def test_unpad_varlen_pad_matches_dense_attention():
    # What model code does with the helpers: unpad, attend per sequence, pad back.
    lengths, seqlen = [9, 4, 1], 9
    mask = padding_mask(lengths, seqlen)
    g = gen(7)
    q, k, v = (torch.randn(3, seqlen, 2, 16, generator=g) for _ in range(3))
    (qr, idx, cu, mx, _), (kr, *_), (vr, *_) = (unpad_input(t, mask) for t in (q, k, v))
    out = pad_input(flashattn.flash_attn_varlen_func(qr, kr, vr, cu, cu, mx, mx, causal=True),
                    idx, 3, seqlen)
    for b, n in enumerate(lengths):
        dense = flashattn.flash_attn_func(q[b:b + 1, :n], k[b:b + 1, :n], v[b:b + 1, :n],
                                          causal=True)
        torch.testing.assert_close(out[b:b + 1, :n], dense, rtol=0, atol=1e-6)
        assert not out[b, n:].any()


# ---- rotary -----------------------------------------------------------------------------------

def rotary_ref(x, cos, sin, positions, interleaved, conjugate=False):
    """Float64 rotary embedding, written out per channel pair: x (..., tokens, heads, d) as a
    numpy array, positions (..., tokens) ints; a position outside the table is not rotated."""
    x = np.asarray(x, dtype=np.float64)
    cos = np.asarray(cos, dtype=np.float64)
    sin = np.asarray(sin, dtype=np.float64) * (-1 if conjugate else 1)
    half = cos.shape[1]
    out = x.copy()
    for index in np.ndindex(*positions.shape):
        p = positions[index]
        if not 0 <= p < cos.shape[0]:
            continue
        for i in range(half):
            a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
            x0, x1 = x[index][..., a], x[index][..., b]
            out[index][..., a] = x0 * cos[p, i] - x1 * sin[p, i]
            out[index][..., b] = x0 * sin[p, i] + x1 * cos[p, i]
    return out


def table(rows, half, dtype=torch.float32, seed=10):
    angle = torch.rand(rows, half, generator=gen(seed), dtype=torch.float64) * 2 * np.pi
    return torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [16, 10])
@pytest.mark.parametrize("offsets", ["none", "int", "tensor"])
def test_rotary_matches_float64(interleaved, rotary_dim, offsets):
    b, s, h, d = 2, 5, 3, 16
    x = torch.randn(b, s, h, d, generator=gen(11))
    cos, sin = table(12, rotary_dim // 2)
    if offsets == "none":
        arg, start = 0, np.zeros(b, dtype=np.int64)
    elif offsets == "int":
        arg, start = 4, np.full(b, 4)
    else:
        # The second sequence runs past the 12-row table: those tokens stay unrotated.
        arg, start = torch.tensor([2, 9], dtype=torch.int32), np.array([2, 9])
    positions = start[:, None] + np.arange(s)[None, :]
    out = apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=arg)
    ref = rotary_ref(x.numpy(), cos.numpy(), sin.numpy(), positions, interleaved)
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=2e-6)
    assert torch.equal(out[..., rotary_dim:], x[..., rotary_dim:])


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_varlen(interleaved):
    cu = torch.tensor([0, 3, 3, 7], dtype=torch.int32)
    total, h, d = 9, 2, 8  # two rows past cu_seqlens[-1]: left as they are
    x = torch.randn(total, h, d, generator=gen(12))
    cos, sin = table(10, 4)
    offsets = torch.tensor([1, 0, 5])
    out = apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=offsets,
                           cu_seqlens=cu, max_seqlen=4)
    positions = np.array([1, 2, 3, 5, 6, 7, 8, -1, -1])
    ref = rotary_ref(x.numpy(), cos.numpy(), sin.numpy(), positions, interleaved)
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=2e-6)


def test_rotary_half_precision_rounds_once():
    # float32 inside, one rounding to bfloat16 at the end: within half a bfloat16 ulp of the
    # float64 result of the bfloat16 inputs.
    x = torch.randn(1, 6, 2, 32, generator=gen(13)).to(torch.bfloat16)
    cos, sin = table(6, 16, torch.bfloat16)
    out = apply_rotary_emb(x, cos, sin)
    assert out.dtype == torch.bfloat16
    ref = rotary_ref(x.float().numpy(), cos.float().numpy(), sin.float().numpy(),
                     np.arange(6)[None, :], False)
    ulp = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(ref), 1e-30))) - 7)
    assert (np.abs(out.float().numpy() - ref) <= 0.5 * ulp + 1e-7).all()


def test_rotary_gradient_is_the_inverse_rotation():
    x = torch.randn(2, 4, 2, 12, generator=gen(14), dtype=torch.float64, requires_grad=True)
    cos, sin = table(4, 4, torch.float64)
    g = torch.randn(2, 4, 2, 12, generator=gen(15), dtype=torch.float64)
    (dx,) = torch.autograd.grad(apply_rotary_emb(x, cos, sin, interleaved=True), x, g)
    ref = rotary_ref(g.numpy(), cos.numpy(), sin.numpy(), np.tile(np.arange(4), (2, 1)), True,
                     conjugate=True)
    np.testing.assert_allclose(dx.numpy(), ref, rtol=0, atol=1e-6)


def test_rotary_inplace():
    x = torch.randn(1, 3, 2, 8, generator=gen(16))
    cos, sin = table(3, 2)
    expect = apply_rotary_emb(x, cos, sin)
    assert apply_rotary_emb(x, cos, sin, inplace=True) is x
    assert torch.equal(x, expect)


def test_rotary_errors():
    x = torch.zeros(1, 4, 1, 8)
    cos, sin = table(8, 4)
    with pytest.raises(ValueError, match="must be <= headdim"):
        apply_rotary_emb(x, *table(8, 5))
    with pytest.raises(ValueError, match="beyond the 8 rows"):
        apply_rotary_emb(x, cos, sin, seqlen_offsets=5)
    with pytest.raises(ValueError, match="needs max_seqlen"):
        apply_rotary_emb(x[0], cos, sin, cu_seqlens=torch.tensor([0, 4], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"\(seqlen_ro, rotary_dim / 2\)"):
        apply_rotary_emb(x, cos, sin[:, :2])


def test_rotary_qkv_and_kv_in_place():
    from flashattn.layers.rotary import apply_rotary_emb_kv_, apply_rotary_emb_qkv_
    cos, sin = table(9, 4)
    cos_k, sin_k = table(9, 4, seed=17)
    qkv = torch.randn(2, 5, 3, 2, 8, generator=gen(18))
    before = qkv.clone()
    assert apply_rotary_emb_qkv_(qkv, cos, sin, cos_k, sin_k, seqlen_offsets=3) is qkv
    assert torch.equal(qkv[:, :, 0], apply_rotary_emb(before[:, :, 0], cos, sin, seqlen_offsets=3))
    assert torch.equal(qkv[:, :, 1], apply_rotary_emb(before[:, :, 1], cos_k, sin_k, seqlen_offsets=3))
    assert torch.equal(qkv[:, :, 2], before[:, :, 2])
    # GQA packing: 4 query heads, 1 + 1 kv heads.
    packed = torch.randn(2, 5, 6, 8, generator=gen(19))
    before = packed.clone()
    apply_rotary_emb_qkv_(packed, cos, sin, interleaved=True, num_heads_q=4)
    assert torch.equal(packed[:, :, :4], apply_rotary_emb(before[:, :, :4], cos, sin, interleaved=True))
    assert torch.equal(packed[:, :, 4:5], apply_rotary_emb(before[:, :, 4:5], cos, sin, interleaved=True))
    assert torch.equal(packed[:, :, 5:], before[:, :, 5:])
    with pytest.raises(ValueError, match="num_heads_q"):
        apply_rotary_emb_qkv_(packed, cos, sin)
    kv = torch.randn(2, 5, 2, 2, 8, generator=gen(20))
    before = kv.clone()
    assert apply_rotary_emb_kv_(kv, cos, sin) is kv
    assert torch.equal(kv[:, :, 0], apply_rotary_emb(before[:, :, 0], cos, sin))
    assert torch.equal(kv[:, :, 1], before[:, :, 1])


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("scale_base", [None, 64.0])
def test_rotary_embedding_module_matches_float64(interleaved, scale_base):
    from flashattn.layers.rotary import RotaryEmbedding
    dim, base, b, s, h, offset = 8, 500.0, 2, 6, 3, 4
    rope = RotaryEmbedding(dim, base=base, interleaved=interleaved, scale_base=scale_base)
    qkv = torch.randn(b, s, 3, h, dim + 4, generator=gen(21), dtype=torch.float64)
    before = qkv.clone()
    assert rope(qkv, seqlen_offset=offset) is qkv
    # The tables, written out: angle t * base^(-2i / dim); XPos scales q by
    # zeta_i^((t - L // 2) / scale_base) and k by its inverse, L = the cached length.
    length = s + offset
    t = np.arange(length, dtype=np.float64)[:, None]
    i = np.arange(dim // 2, dtype=np.float64)[None, :]
    angle = t * base ** (-2 * i / dim)
    zeta = (2 * i + 0.4 * dim) / (1.4 * dim)
    xpos = zeta ** ((t - length // 2) / scale_base) if scale_base else np.ones_like(angle)
    positions = np.tile(np.arange(offset, offset + s), (b, 1))
    for part, factor in ((0, xpos), (1, 1 / xpos)):
        ref = rotary_ref(before[:, :, part].numpy(), np.cos(angle) * factor, np.sin(angle) * factor,
                         positions, interleaved)
        np.testing.assert_allclose(qkv[:, :, part].numpy(), ref, rtol=0, atol=1e-6)
    assert torch.equal(qkv[:, :, 2], before[:, :, 2])
    # q and kv separately, tensor offsets with max_seqlen.
    q, kv = before[:, :, 0].clone(), before[:, :, 1:].clone()
    offsets = torch.tensor([4, 0])
    rope2 = RotaryEmbedding(dim, base=base, interleaved=interleaved, scale_base=scale_base)
    q_out, kv_out = rope2(q, kv, seqlen_offset=offsets, max_seqlen=length)
    assert q_out is q and kv_out is kv
    positions = offsets.numpy()[:, None] + np.arange(s)[None, :]
    ref_q = rotary_ref(before[:, :, 0].numpy(), np.cos(angle) * xpos, np.sin(angle) * xpos, positions, interleaved)
    np.testing.assert_allclose(q.numpy(), ref_q, rtol=0, atol=1e-6)
    assert torch.equal(kv[:, :, 1], before[:, :, 2])
    with pytest.raises(ValueError, match="needs max_seqlen"):
        RotaryEmbedding(dim)(before[:, :, 0].clone(), before[:, :, 1:].clone(), seqlen_offset=offsets)


def test_rotary_embedding_gradient_through_in_place():
    from flashattn.layers.rotary import RotaryEmbedding
    w = torch.randn(2, 4, 3, 2, 8, generator=gen(22), requires_grad=True)
    qkv = w * 1.0  # not a leaf: in-place rotation is recorded by autograd
    out = RotaryEmbedding(8)(qkv)
    g = torch.randn_like(out)
    (dw,) = torch.autograd.grad(out, w, g)
    t = torch.arange(4, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, 8, 2) / 8.0)
    ref = rotary_ref(g[:, :, 0].numpy(), torch.cos(t).numpy(), torch.sin(t).numpy(),
                     np.tile(np.arange(4), (2, 1)), False, conjugate=True)
    np.testing.assert_allclose(dw[:, :, 0].numpy(), ref, rtol=0, atol=1e-5)
    assert torch.equal(dw[:, :, 2], g[:, :, 2])


def test_rotary_embedding_signature_and_pos_idx_in_fp32():
    from flashattn.layers.rotary import RotaryEmbedding
    # flash_attn's positional order: dim, base, interleaved, scale_base, pos_idx_in_fp32, device.
    rope = RotaryEmbedding(8, 10000.0, False, None, True, "cpu")
    assert rope.pos_idx_in_fp32 and rope.inv_freq.device.type == "cpu"
    x = torch.randn(1, 300, 3, 1, 8, generator=gen(23))
    a = RotaryEmbedding(8)(x.clone())
    # float32 buffers: positions in float32 either way.
    assert torch.equal(RotaryEmbedding(8, pos_idx_in_fp32=False)(x.clone()), a)
    # A module cast to bfloat16: False takes positions in bfloat16 (rounded beyond 256), True
    # recomputes float32 frequencies.
    half = RotaryEmbedding(8, pos_idx_in_fp32=False).to(torch.bfloat16)
    exact = RotaryEmbedding(8).to(torch.bfloat16)
    assert torch.equal(exact(x.clone()), a)
    assert not torch.equal(half(x.clone()), a)
