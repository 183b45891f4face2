"""Issue 18 beyond dense calls: attn_bias / attn_mask / block_mask on the varlen functions, the
compressed block mask (flashattn.BlockMask, FlexAttention's layout) and its builders
(block_mask_from_dense, block_mask_from_mask_mod, block_mask_from_flex). Everything is checked
against the float64 reference (score_ref.py) given the equivalent dense keep mask, which these
tests derive on their own (numpy predicates, list expansion). The varlen cases also run on the
GPU (dq, dk, dv and dbias for each bias broadcast pattern; skipped without a GPU)."""

import numpy as np
import pytest

import flashattn
from score_ref import close, dense_keep, reduce_like, reference

RNG = np.random.default_rng(1828)


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _torch():
    return pytest.importorskip("torch")


def run_torch(q, k, v, dout, *args, fn=flashattn.flash_attn_func, **kw):
    """fn(q, k, v, *args, **kw) on torch tensors with autograd: out and (dq, dk, dv) as numpy
    (other leaves in kw, e.g. a bias, get their .grad as usual)."""
    torch = _torch()
    leaf = [torch.from_numpy(x).requires_grad_() for x in (q, k, v)]
    out = fn(*leaf, *args, **kw)
    out.backward(torch.from_numpy(dout))
    return out.detach().numpy(), [t.grad.numpy() for t in leaf]


# ---- varlen ----------------------------------------------------------------------------------

LENS_Q, LENS_K = [37, 1, 64, 0, 20], [53, 77, 100, 10, 0]  # empty sequences on either side
H, HK, D, DV = 4, 2, 16, 12
MAX_Q, MAX_K = max(LENS_Q), max(LENS_K)
B = len(LENS_Q)


def cu(lens):
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def varlen_inputs():
    tq, tk = sum(LENS_Q), sum(LENS_K)
    return randn(tq, H, D), randn(tk, HK, D), randn(tk, HK, DV), randn(tq, H, DV)


def varlen_reference(q, k, v, dout, bias, keep, scale, softcap=0.0):
    """Per sequence, the dense reference on its rows: bias and keep are laid out over
    (MAX_Q, MAX_K) and indexed by positions inside the sequence. Returns out, lse (heads,
    total_q), dq, dk, dv and dS (B, H, MAX_Q, MAX_K), zero outside each sequence."""
    cq, ck = cu(LENS_Q), cu(LENS_K)
    out, dq = np.zeros(q.shape[:2] + (DV,)), np.zeros(q.shape)
    dk, dv = np.zeros(k.shape), np.zeros(v.shape)
    lse = np.zeros((H, cq[-1]))
    ds = np.zeros((B, H, MAX_Q, MAX_K))
    for b in range(B):
        lq, lk = LENS_Q[b], LENS_K[b]
        rq, rk = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        sb = None
        if bias is not None:
            sb = bias[min(b, bias.shape[0] - 1):][:1, :, :lq if bias.shape[2] > 1 else 1, :lk]
        r = reference(q[None, rq], k[None, rk], v[None, rk], dout[None, rq], sb,
                      keep[b:b + 1, :, :lq, :lk], scale, softcap)
        out[rq], lse[:, rq], dq[rq], dk[rk], dv[rk] = r[0][0], r[1][0], r[2][0], r[3][0], r[4][0]
        ds[b, :, :lq, :lk] = r[5][0]
    return out, lse, dq, dk, dv, ds


VARLEN_CASES = [
    dict(bias=(B, H, MAX_Q, MAX_K)),
    dict(bias=(1, H, MAX_Q, MAX_K), causal=True, mask=(B, 1, MAX_Q, MAX_K)),  # one bias for all
    dict(bias=(B, 1, 1, MAX_K), block=(1, H), bs=(16, 8), density=0.5),  # key padding bias
    dict(block=(B, 1), bs=(7, 9), density=0.4, mask=(1, H, MAX_Q, MAX_K), window=(20, 5)),
    dict(bias=(B, H, 1, MAX_K), causal=True, block=(B, H), bs=(16, 16), density=1.0),
    dict(bias=(1, 1, 1, MAX_K), block=(1, 1), bs=(8, 8), density=0.0),  # nothing kept: dbias 0
    dict(bias=(1, 1, MAX_Q, MAX_K), block=(B, H), bs=(16, 8), density=0.5),
]


def make_varlen_case(c):
    bias = 2 * randn(*c["bias"]) if "bias" in c else None
    mask = RNG.random(c["mask"]) < 0.7 if "mask" in c else None
    block, bs = None, c.get("bs")
    if "block" in c:
        block = RNG.random((*c["block"], -(-MAX_Q // bs[0]), -(-MAX_K // bs[1]))) < c["density"]
        block[:, :, 0] = False  # query block 0 keeps nothing: rows with no kept block
    # Per sequence the causal / window diagonal uses the sequence's own lengths.
    keep = np.zeros((B, H, MAX_Q, MAX_K), dtype=bool)
    for b in range(B):
        lq, lk = LENS_Q[b], LENS_K[b]
        m = None if mask is None else mask[min(b, mask.shape[0] - 1):][:1, :, :lq, :lk]
        blk = None if block is None else block[min(b, block.shape[0] - 1):][:1]
        keep[b:b + 1, :, :lq, :lk] = dense_keep(1, H, lq, lk, c.get("causal", False), m, blk, bs,
                                                c.get("window", (-1, -1)))
    return bias, mask, block, bs, keep


@pytest.mark.parametrize("case", range(len(VARLEN_CASES)))
def test_varlen_numpy_forward_and_backward(case):
    c = VARLEN_CASES[case]
    q, k, v, dout = varlen_inputs()
    bias, mask, block, bs, keep = make_varlen_case(c)
    scale = D ** -0.5
    ref = varlen_reference(q, k, v, dout, bias, keep, scale)
    kw = dict(causal=c.get("causal", False), window_size=c.get("window", (-1, -1)),
              attn_bias=bias, attn_mask=mask, block_mask=block, block_size=bs)
    out, lse, _ = flashattn.flash_attn_varlen_func(q, k, v, cu(LENS_Q), cu(LENS_K), MAX_Q, MAX_K,
                                                   return_attn_probs=True, **kw)
    close(out, ref[0], "out")
    close(lse, ref[1], "lse")
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    dbias = np.empty(bias.shape, np.float32) if bias is not None else None
    flashattn.backward(dout, q, k, v, out, lse, dq, dk, dv, cu_seqlens_q=cu(LENS_Q),
                       cu_seqlens_k=cu(LENS_K), max_seqlen_q=MAX_Q, max_seqlen_k=MAX_K,
                       dbias=dbias, **kw)
    for name, ours, theirs in (("dq", dq, ref[2]), ("dk", dk, ref[3]), ("dv", dv, ref[4])):
        close(ours, theirs, name)
    if bias is not None:
        close(dbias, reduce_like(ref[5], bias.shape), "dbias")


@pytest.mark.parametrize("case", range(len(VARLEN_CASES)))
def test_varlen_torch_autograd(case):
    torch = _torch()
    c = VARLEN_CASES[case]
    q, k, v, dout = varlen_inputs()
    bias, mask, block, bs, keep = make_varlen_case(c)
    bias_t = torch.from_numpy(bias).requires_grad_() if bias is not None else None
    out, grads = run_torch(
        q, k, v, dout, torch.from_numpy(cu(LENS_Q)), torch.from_numpy(cu(LENS_K)), MAX_Q, MAX_K,
        fn=flashattn.flash_attn_varlen_func, causal=c.get("causal", False),
        window_size=c.get("window", (-1, -1)), attn_bias=bias_t,
        attn_mask=torch.from_numpy(mask) if mask is not None else None,
        block_mask=torch.from_numpy(block) if block is not None else None, block_size=bs)
    ref = varlen_reference(q, k, v, dout, bias, keep, D ** -0.5)
    close(out, ref[0], "out")
    for name, ours, theirs in zip(("dq", "dk", "dv"), grads, ref[2:5]):
        close(ours, theirs, name)
    if bias is not None:
        close(bias_t.grad.numpy(), reduce_like(ref[5], bias.shape), "dbias")


@pytest.mark.parametrize("case", range(len(VARLEN_CASES)))
def test_cuda_varlen_backward_matches_float64(case):
    """The varlen cases on the GPU (bf16; empty sequences, rows with no kept key, every bias
    broadcast pattern): out, dq, dk, dv and dbias against the float64 reference of the same
    bf16 values, with the naive bf16 computation of each sequence (torch) as the yardstick."""
    torch = _torch()
    if not flashattn.cuda_built() or not flashattn.cuda_available() or not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from attn_ref import assert_fa_close
    from score_ref import torch_reference
    import torch_ref
    c = VARLEN_CASES[case]
    dev = torch.device("cuda")
    q, k, v, dout = (torch.from_numpy(x).to(dev, torch.bfloat16) for x in varlen_inputs())
    bias, mask, block, bs, keep = make_varlen_case(c)
    cq, ck = torch.from_numpy(cu(LENS_Q)).to(dev), torch.from_numpy(cu(LENS_K)).to(dev)
    scale = D ** -0.5

    def fa(q, k, v, *b):
        return flashattn.flash_attn_varlen_func(
            q, k, v, cq, ck, MAX_Q, MAX_K, causal=c.get("causal", False),
            window_size=c.get("window", (-1, -1)), attn_bias=b[0] if b else None,
            attn_mask=torch.from_numpy(mask).to(dev) if mask is not None else None,
            block_mask=torch.from_numpy(block).to(dev) if block is not None else None, block_size=bs)

    inputs = [q, k, v] + ([torch.from_numpy(bias).to(dev)] if bias is not None else [])
    ours = torch_ref.values_and_grads(fa, inputs, dout)
    f32 = [x.float().cpu().numpy() for x in (q, k, v, dout)]
    ref = varlen_reference(*f32, bias, keep, scale)
    ref64 = list(ref[:1]) + list(ref[2:5]) + ([reduce_like(ref[5], bias.shape)] if bias is not None else [])
    # The yardstick: each sequence's dense attention in bf16, its dS as the bias gradient.
    naive = [np.zeros(r.shape) for r in ref64[:4]]
    ds = np.zeros((B, H, MAX_Q, MAX_K))
    for b in range(B):
        lq, lk = LENS_Q[b], LENS_K[b]
        if lq == 0 or lk == 0:
            continue
        oq, ok = cu(LENS_Q), cu(LENS_K)
        rq, rk = slice(int(oq[b]), int(oq[b + 1])), slice(int(ok[b]), int(ok[b + 1]))
        kb = torch.from_numpy(keep[b:b + 1, :, :lq, :lk]).to(dev)
        sb = torch.zeros(1, H, lq, lk, device=dev)
        if bias is not None:
            sl = bias[min(b, bias.shape[0] - 1):][:1, :, :lq if bias.shape[2] > 1 else 1, :lk]
            sb = sb + torch.from_numpy(sl).to(dev)

        def seq(qs, ks, vs, bs_):
            return torch_reference(qs, ks, vs, bs_, kb, scale)[0]  # (lq, H, DV)

        r = torch_ref.values_and_grads(lambda qs, ks, vs, bs_: seq(qs[None], ks[None], vs[None], bs_),
                                       [q[rq], k[rk], v[rk], sb], dout[rq])
        naive[0][rq], naive[1][rq], naive[2][rk], naive[3][rk] = r[0], r[1], r[2], r[3]
        ds[b, :, :lq, :lk] = r[4][0]
    if bias is not None:
        naive.append(reduce_like(ds, bias.shape))
    for name, o, r, n in zip(("out", "dq", "dk", "dv", "dbias"), ours, ref64, naive):
        # dbias: also the C++ suite's 2 u (max|dbias| + 0.3), u = 2^-8 (test_bias.py dbias_atol).
        atol = {"out": 1e-3, "dbias": max(1e-2, 2 * 2.0**-8 * (np.abs(r).max() + 0.3))}.get(name, 1e-2)
        assert_fa_close(name, o, r, n, atol)


def test_varlen_packed_variants_take_the_bias():
    """The packed varlen functions pass the bias and masks through like the unpacked one."""
    lens = [30, 45]
    cs, total = cu(lens), sum(lens)
    qkv = randn(total, 3, H, D)
    bias = randn(1, H, 45, 45)
    mask = RNG.random((2, 1, 45, 45)) < 0.8
    kw = dict(attn_bias=bias, attn_mask=mask, causal=True)
    unpacked = flashattn.flash_attn_varlen_func(qkv[:, 0], qkv[:, 1], qkv[:, 2], cs, cs, 45, 45,
                                                **kw)
    packed = flashattn.flash_attn_varlen_qkvpacked_func(qkv, cs, 45, **kw)
    kvpacked = flashattn.flash_attn_varlen_kvpacked_func(qkv[:, 0], qkv[:, 1:], cs, cs, 45, 45,
                                                         **kw)
    np.testing.assert_array_equal(packed, unpacked)
    np.testing.assert_array_equal(kvpacked, unpacked)


# ---- the compressed block mask ---------------------------------------------------------------

def block_states(bm, nkb):
    """int8 (B|1, H|1, q_blocks, nkb) of a BlockMask's lists, expanded here on their own:
    0 absent, 1 partial, 2 full."""
    pieces = [p for p in ((bm.kv_num_blocks, bm.kv_indices, 1),
                          (bm.full_kv_num_blocks, bm.full_kv_indices, 2)) if p[0] is not None]
    lead = np.broadcast_shapes(*(np.asarray(p[0]).shape for p in pieces))
    states = np.zeros(lead + (nkb,), dtype=np.int8)
    for num, idx, value in pieces:
        num, idx = np.broadcast_to(np.asarray(num), lead), np.asarray(idx)
        for b, h, r in np.ndindex(*lead):
            row = idx[min(b, idx.shape[0] - 1), min(h, idx.shape[1] - 1), r]
            states[b, h, r, row[:num[b, h, r]]] = value
    return states


def keep_of(bm, sq, sk, causal=False, window=(-1, -1)):
    """The dense keep mask (1|B, 1|H, sq, sk) a BlockMask describes, with causal / window."""
    bq, bk = bm.block_size
    states = block_states(bm, -(-sk // bk))
    st = states[:, :, np.arange(sq) // bq][:, :, :, np.arange(sk) // bk]
    elem = np.ones((1, 1, sq, sk), dtype=bool)
    if bm.mask is not None:
        elem = np.asarray(bm.mask)[..., :sq, :sk].astype(bool)
    keep = (st == 2) | ((st == 1) & elem)
    return keep & dense_keep(1, 1, sq, sk, causal, None, None, None, window)


def numpy_states(elem, bq, bk):
    """0 / 1 / 2 (absent / partial / full) per block of a dense element mask, by brute force."""
    *lead, sq, sk = elem.shape
    nqb, nkb = -(-sq // bq), -(-sk // bk)
    out = np.zeros((*lead, nqb, nkb), dtype=np.int8)
    for r in range(nqb):
        for c in range(nkb):
            blk = elem[..., r * bq:(r + 1) * bq, c * bk:(c + 1) * bk]
            out[..., r, c] = np.where(blk.all(axis=(-2, -1)), 2, np.where(blk.any(axis=(-2, -1)), 1, 0))
    return out


SQ, SK = 150, 190
# Document ids of 256 positions (FlexAttention evaluates mask_mods up to the padded lengths).
DOC = np.repeat(np.arange(7), [30, 5, 61, 40, 20, 34, 66])


def mask_mods():
    """name -> (mask_mod for torch, the same predicate on numpy index grids, B, H)."""
    torch = _torch()
    doc = torch.from_numpy(DOC)
    prefix = torch.tensor([40, 100])
    return {
        "document": (lambda b, h, q, kv: doc[q] == doc[kv],
                     lambda b, h, q, kv: DOC[q] == DOC[kv], None, None),
        "dilated_window": (lambda b, h, q, kv: ((q - kv).abs() <= 40) & ((q - kv) % 3 == 0),
                           lambda b, h, q, kv: (np.abs(q - kv) <= 40) & ((q - kv) % 3 == 0),
                           None, None),
        "per_head": (lambda b, h, q, kv: kv % (h + 2) != 0,
                     lambda b, h, q, kv: kv % (h + 2) != 0, None, 4),
        "per_batch_prefix": (lambda b, h, q, kv: kv < prefix[b] + q // 2,
                             lambda b, h, q, kv: kv < np.array([40, 100])[b] + q // 2, 2, None),
        "nothing": (lambda b, h, q, kv: q < 0, lambda b, h, q, kv: q < 0 + 0 * kv, None, None),
        "everything": (lambda b, h, q, kv: q >= 0, lambda b, h, q, kv: q >= 0 + 0 * kv, None, None),
    }


def numpy_predicate(pred, b, h):
    """The predicate on index grids: bool (b, h, SQ, SK)."""
    bi, hi, qi, ki = np.ix_(np.arange(b), np.arange(h), np.arange(SQ), np.arange(SK))
    return np.broadcast_to(pred(bi, hi, qi, ki), (b, h, SQ, SK))


MOD_CASES = [
    dict(mod="document", bs=(32, 16)),
    dict(mod="document", bs=(16, 64), causal=True, softcap=2.5),
    dict(mod="dilated_window", bs=(24, 40), window=(60, 10)),
    dict(mod="per_head", bs=(50, 50), hk=1),
    dict(mod="per_batch_prefix", bs=(32, 32), causal=True),
    dict(mod="nothing", bs=(64, 64)),
    dict(mod="everything", bs=(40, 24), softcap=4.0),
]




@pytest.mark.parametrize("case", range(len(MOD_CASES)))
def test_block_mask_from_mask_mod_matches_the_dense_mask(case):
    c = MOD_CASES[case]
    mod, pred, mb, mh = mask_mods()[c["mod"]]
    bq, bk = c["bs"]
    bm = flashattn.block_mask_from_mask_mod(mod, mb, mh, SQ, SK, (bq, bk), device="cpu")
    elem = numpy_predicate(pred, mb or 1, mh or 1)
    # Every block classified from every element (not from its corners).
    assert np.array_equal(block_states(bm, -(-SK // bk)), numpy_states(elem, bq, bk))
    assert (bm.mask is None) == (not (numpy_states(elem, bq, bk) == 1).any())

    hk = c.get("hk", 2)
    q, k, v, dout = randn(2, SQ, 4, D), randn(2, SK, hk, D), randn(2, SK, hk, DV), randn(2, SQ, 4, DV)
    kw = dict(causal=c.get("causal", False), window_size=c.get("window", (-1, -1)),
              softcap=c.get("softcap", 0.0))
    out, grads = run_torch(q, k, v, dout, block_mask=bm, **kw)
    keep = elem & dense_keep(1, 1, SQ, SK, kw["causal"], None, None, None, kw["window_size"])
    keep = np.broadcast_to(keep, (2, 4, SQ, SK))
    ref = reference(q, k, v, dout, None, keep, D ** -0.5, kw["softcap"])
    # The lists and element mask, expanded here, describe exactly that mask.
    assert np.array_equal(np.broadcast_to(keep_of(bm, SQ, SK, kw["causal"], kw["window_size"]),
                                          keep.shape), keep)
    close(out, ref[0], "out")
    for name, ours, theirs in zip(("dq", "dk", "dv"), grads, ref[2:5]):
        close(ours, theirs, name)
    if c["mod"] == "nothing":
        assert not out.any() and not any(g.any() for g in grads)


def test_mask_mod_is_evaluated_inside_blocks():
    """A predicate true on every block corner but false on one row inside each block: every
    block is partial (corner evaluation would call them all full)."""
    pytest.importorskip("torch")  # the predicate is evaluated with FlexAttention's create_mask
    bm = flashattn.block_mask_from_mask_mod(lambda b, h, q, kv: q % 16 != 7, None, None, 64, 48,
                                            16, device="cpu")
    states = block_states(bm, 3)
    assert (states == 1).all()
    assert bm.mask is not None and not bm.mask[0, 0, 7].any() and bm.mask[0, 0, 8].all()


def test_block_mask_from_dense_gives_the_dense_results_bitwise():
    """The dense block mask with attn_mask, and its compressed form, are one mask: the CPU
    backend gives bitwise the same outputs and gradients."""
    torch = _torch()
    b, h, hk, sq, sk, bs = 2, 4, 2, 70, 90, (16, 8)
    nqb, nkb = -(-sq // bs[0]), -(-sk // bs[1])
    block = torch.from_numpy(RNG.random((1, h, nqb, nkb)) < 0.6)
    mask = torch.from_numpy(RNG.random((b, 1, sq, sk)) < 0.9)
    rows, cols = torch.arange(sq) // bs[0], torch.arange(sk) // bs[1]
    mask |= ((rows[:, None] + cols[None, :]) % 3 == 0)  # blocks with an all-true mask: full
    mask &= ~((rows[:, None] + cols[None, :]) % 3 == 1)  # all-false: absent
    bm = flashattn.block_mask_from_dense(block, bs, mask)
    states = block_states(bm, nkb)
    assert {0, 1, 2} <= set(np.unique(states).tolist())
    q, k, v, dout = randn(b, sq, h, D), randn(b, sk, hk, D), randn(b, sk, hk, DV), randn(b, sq, h, DV)
    bias = torch.from_numpy(randn(1, h, sq, sk))
    dense = run_torch(q, k, v, dout, block_mask=block, block_size=bs, attn_mask=mask,
                      attn_bias=bias, causal=True)
    compressed = run_torch(q, k, v, dout, block_mask=bm, attn_bias=bias, causal=True)
    np.testing.assert_array_equal(compressed[0], dense[0])
    for ours, theirs in zip(compressed[1], dense[1]):
        np.testing.assert_array_equal(ours, theirs)
    # Without an element mask every kept block is full.
    full_only = flashattn.block_mask_from_dense(block, bs)
    assert full_only.mask is None
    assert np.array_equal(block_states(full_only, nkb), 2 * block.numpy())


def test_numpy_block_mask_and_full_blocks_ignore_the_mask():
    """A hand-made BlockMask of numpy arrays: full blocks do not read its element mask (zero
    there), partial blocks do; unlisted blocks are absent."""
    sq, sk, bs = 40, 50, (16, 16)  # 3 x 4 blocks
    num = np.array([[[1, 2, 0]]], np.int32)
    idx = np.array([[[[2, 9, 9, 9], [0, 3, 9, 9], [0, 0, 0, 0]]]], np.int32)  # past the count: junk
    full_num = np.array([[[1, 1, 2]]], np.int32)
    full_idx = np.array([[[[0, 0, 0, 0], [1, 0, 0, 0], [3, 1, 0, 0]]]], np.int32)
    mask = RNG.random((1, 1, sq, sk)) < 0.6
    mask[:, :, :16, :16] = False  # block (0, 0) is full: its mask is never read
    bm = flashattn.BlockMask(num, idx, full_num, full_idx, bs, mask)
    q, k, v, dout = randn(2, sq, 2, D), randn(2, sk, 2, D), randn(2, sk, 2, DV), randn(2, sq, 2, DV)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, block_mask=bm, return_attn_probs=True)
    keep = np.broadcast_to(keep_of(bm, sq, sk), (2, 2, sq, sk))
    assert keep[0, 0, :16, :16].all()
    ref = reference(q, k, v, dout, None, keep, D ** -0.5)
    close(out, ref[0], "out")
    close(lse, ref[1], "lse")


def test_varlen_with_a_block_mask_from_mask_mod():
    """A BlockMask over (max_seqlen_q, max_seqlen_k) on a varlen call, positions inside each
    sequence; its element mask is cut to the call's lengths."""
    torch = _torch()
    # Built for 70 x 103 positions: the same 3 x 5 blocks of 24 as 64 x 100, a larger mask.
    bm = flashattn.block_mask_from_mask_mod(lambda b, h, q, kv: (q - kv).abs() % 5 != 2, None, H,
                                            MAX_Q + 6, MAX_K + 3, 24, device="cpu")
    assert bm.mask.shape == (1, H, MAX_Q + 6, MAX_K + 3)
    q, k, v, dout = varlen_inputs()
    keep = np.broadcast_to(keep_of(bm, MAX_Q, MAX_K, causal=False), (B, H, MAX_Q, MAX_K)).copy()
    keep_c = np.zeros_like(keep)
    for b in range(B):
        lq, lk = LENS_Q[b], LENS_K[b]
        keep_c[b, :, :lq, :lk] = keep[b, :, :lq, :lk] & dense_keep(1, 1, lq, lk, True, None, None,
                                                                   None)
    out, grads = run_torch(q, k, v, dout, torch.from_numpy(cu(LENS_Q)),
                           torch.from_numpy(cu(LENS_K)), MAX_Q, MAX_K,
                           fn=flashattn.flash_attn_varlen_func, causal=True, block_mask=bm)
    ref = varlen_reference(q, k, v, dout, None, keep_c, D ** -0.5)
    close(out, ref[0], "out")
    for name, ours, theirs in zip(("dq", "dk", "dv"), grads, ref[2:5]):
        close(ours, theirs, name)


# ---- FlexAttention's BlockMask ---------------------------------------------------------------

def _flex():
    _torch()
    return pytest.importorskip("torch.nn.attention.flex_attention")


def test_block_mask_from_flex():
    flex = _flex()
    torch = _torch()
    doc = torch.from_numpy(DOC)

    def doc_causal(b, h, q, kv):
        return (doc[q] == doc[kv]) & (q >= kv)

    fbm = flex.create_block_mask(doc_causal, 2, None, SQ, SK, device="cpu")
    bq, bk = fbm.BLOCK_SIZE
    bm = flashattn.block_mask_from_flex(fbm)
    assert bm.block_size == (bq, bk) and bm.kv_indices is fbm.kv_indices
    q, k, v, dout = randn(2, SQ, 4, D), randn(2, SK, 2, D), randn(2, SK, 2, DV), randn(2, SQ, 4, DV)
    out, grads = run_torch(q, k, v, dout, block_mask=bm)
    pred = numpy_predicate(lambda b, h, qi, ki: (DOC[qi] == DOC[ki]) & (qi >= ki), 1, 1)
    keep = np.broadcast_to(pred, (2, 4, SQ, SK))
    ref = reference(q, k, v, dout, None, keep, D ** -0.5)
    close(out, ref[0], "out")
    for name, ours, theirs in zip(("dq", "dk", "dv"), grads, ref[2:5]):
        close(ours, theirs, name)


def test_block_mask_from_flex_noop_mask_and_block_size():
    """A Flex mask built from kv lists alone (noop mask_mod): partial blocks need no element
    mask. torch 2.5's create_block_mask records BLOCK_SIZE (128, 128) whatever it used: the
    wrong size is refused loudly, block_size= fixes it."""
    flex = _flex()
    torch = _torch()
    nqb, nkb = -(-SQ // 32), -(-SK // 64)
    dense = torch.from_numpy(RNG.random((1, 1, nqb, nkb)) < 0.5)
    num = dense.sum(-1, dtype=torch.int32)
    idx = torch.argsort(dense.to(torch.uint8), dim=-1, descending=True, stable=True).to(torch.int32)
    fbm = flex.BlockMask.from_kv_blocks(num, idx, BLOCK_SIZE=(32, 64))
    bm = flashattn.block_mask_from_flex(fbm)
    assert bm.mask is None and bm.block_size == (32, 64)
    q, k, v, dout = randn(1, SQ, 2, D), randn(1, SK, 2, D), randn(1, SK, 2, DV), randn(1, SQ, 2, DV)
    ours = run_torch(q, k, v, dout, block_mask=bm)
    theirs = run_torch(q, k, v, dout, block_mask=dense, block_size=(32, 64))
    np.testing.assert_array_equal(ours[0], theirs[0])

    fbm = flex.create_block_mask(lambda b, h, q, kv: q >= kv, None, None, SQ, SK, device="cpu",
                                 BLOCK_SIZE=(64, 32))
    if tuple(fbm.BLOCK_SIZE) != (64, 32):
        with pytest.raises(ValueError, match="kv_num_blocks must have shape"):
            run_torch(q, k, v, dout, block_mask=flashattn.block_mask_from_flex(fbm))
    out, _ = run_torch(q, k, v, dout, block_mask=flashattn.block_mask_from_flex(fbm, block_size=(64, 32)))
    keep = np.broadcast_to(np.tril(np.ones((SQ, SK), dtype=bool)), (1, 2, SQ, SK))
    close(out, reference(q, k, v, dout, None, keep, D ** -0.5)[0], "out")


# ---- errors, ops, compile, CUDA ---------------------------------------------------------------

def test_block_mask_errors():
    flex = _flex()
    torch = _torch()
    q, k, v = (torch.from_numpy(randn(1, 40, 2, D)) for _ in range(3))
    bm = flashattn.block_mask_from_mask_mod(lambda b, h, qi, ki: (qi + ki) % 3 != 0, None, None, 40,
                                            40, 16, device="cpu")
    assert bm.mask is not None
    with pytest.raises(ValueError, match="combine them into the BlockMask's mask"):
        flashattn.flash_attn_func(q, k, v, block_mask=bm, attn_mask=torch.ones(1, 1, 40, 40, dtype=torch.bool))
    with pytest.raises(ValueError, match="differs from the BlockMask's block_size"):
        flashattn.flash_attn_func(q, k, v, block_mask=bm, block_size=(8, 8))
    with pytest.raises(ValueError, match=r"BlockMask.mask covers \(30, 40\)"):
        flashattn.flash_attn_func(q, k, v, block_mask=bm._replace(mask=bm.mask[:, :, :30]))
    with pytest.raises(ValueError, match="neither kv_num_blocks nor full_kv_num_blocks"):
        flashattn.flash_attn_func(q, k, v, block_mask=flashattn.BlockMask(None, None, None, None, (16, 16)))
    fbm = flex.create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, 40, 40, device="cpu")
    with pytest.raises(TypeError, match="block_mask_from_flex"):
        flashattn.flash_attn_func(q, k, v, block_mask=fbm)
    bad = bm.kv_indices.clone()
    bad[0, 0, 0, 0] = 3  # only key blocks 0..2 exist
    with pytest.raises(ValueError, match=r"kv_indices\[0, 0, 0, 0\] = 3 is outside \[0, 3\)"):
        flashattn.flash_attn_func(q, k, v, block_mask=bm._replace(kv_indices=bad))


def test_ops_with_block_lists_pass_opcheck():
    torch = _torch()
    q, k, v = (torch.from_numpy(randn(1, 40, 2, D)).requires_grad_() for _ in range(3))
    bm = flashattn.block_mask_from_mask_mod(lambda b, h, qi, ki: (qi - ki) % 4 != 1, None, 2, 40, 40,
                                            (16, 8), device="cpu")
    opts = (None, None, 0, 0, None, 0.0, False, -1, -1, 0.0, 0.0, None, False, None, None,
            bm.mask, None, 16, 8, bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks,
            bm.full_kv_indices)
    ops = torch.ops.flashattn
    torch.library.opcheck(ops.fwd.default, (q, k, v) + opts)
    out, lse = ops.fwd(q, k, v, *opts)
    torch.library.opcheck(ops.bwd.default, (torch.ones_like(out), q, k, v, out, lse) + opts,
                          test_utils=("test_schema", "test_faketensor"))


def test_compile_fullgraph_with_a_block_mask():
    torch = _torch()
    bm = flashattn.block_mask_from_mask_mod(lambda b, h, qi, ki: (qi - ki).abs() < 20, None, None, 50,
                                            50, 16, device="cpu")
    q, k, v = (torch.from_numpy(randn(1, 50, 2, D)).requires_grad_() for _ in range(3))

    def f(q, k, v, bm):
        return flashattn.flash_attn_func(q, k, v, block_mask=bm, causal=True)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    got, want = compiled(q, k, v, bm), f(q, k, v, bm)
    assert torch.equal(got, want)
    got.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_cuda_builders_run_on_the_device_and_the_forward_takes_them():
    torch = _torch()
    if not torch.cuda.is_available() or not flashattn.cuda_available():
        pytest.skip("no CUDA device")
    import torch_ref
    from attn_ref import assert_fa_close
    bm = flashattn.block_mask_from_mask_mod(lambda b, h, qi, ki: qi >= ki, None, None, 256, 256, 64,
                                            device="cuda")
    assert bm.kv_indices.is_cuda and bm.full_kv_indices.is_cuda
    dense = flashattn.block_mask_from_dense(torch.ones(1, 1, 4, 4, dtype=torch.bool, device="cuda"),
                                            64)
    assert dense.full_kv_num_blocks.is_cuda
    q, k, v = (torch.randn(1, 256, 2, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    # Everything kept (full blocks) is plain attention; the causal mask_mod is causal attention
    # (its diagonal blocks are partial, read through the evaluated element mask).
    for block_mask, causal in [(dense, False), (bm, True)]:
        out = flashattn.flash_attn_func(q, k, v, block_mask=block_mask)
        ref = torch_ref.attention(q.double(), k.double(), v.double(), causal=causal)[0]
        naive = torch_ref.attention(q, k, v, causal=causal)[0]
        assert_fa_close("out", out.float().cpu().numpy(), ref.cpu().numpy(), naive.float().cpu().numpy(), 1e-3)
    # The backward takes them too: the causal mask_mod's lists give causal attention's gradients.
    dout = torch.randn_like(q)
    ours = torch_ref.values_and_grads(lambda q, k, v: flashattn.flash_attn_func(q, k, v, block_mask=bm),
                                      [q, k, v], dout)
    causal = lambda q, k, v: torch_ref.attention(q, k, v, causal=True)[0]  # noqa: E731
    ref = torch_ref.values_and_grads(causal, [x.double() for x in (q, k, v)], dout)
    naive = torch_ref.values_and_grads(causal, [q, k, v], dout)
    for name, o, r, n in zip(("out", "dq", "dk", "dv"), ours, ref, naive):
        assert_fa_close(name, o, r, n, 1e-2)


def test_cuda_varlen_lists_match_the_cpu_backend():
    """The compressed form on a varlen CUDA call against the same call on the CPU backend
    (bf16 inputs; the CPU computes in float32): out, and the gradients of q, k, v and of the
    bias (shared by the batch: the CUDA reduction's path)."""
    torch = _torch()
    if not torch.cuda.is_available() or not flashattn.cuda_available():
        pytest.skip("no CUDA device")
    from attn_ref import assert_fa_close
    lens_q, lens_k, bs = [100, 1, 260, 0], [130, 300, 200, 7], 64
    cu_q = torch.tensor(np.cumsum([0] + lens_q), dtype=torch.int32)
    cu_k = torch.tensor(np.cumsum([0] + lens_k), dtype=torch.int32)
    mq, mk = max(lens_q), max(lens_k)
    nq, nk = -(-mq // bs), -(-mk // bs)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(sum(lens_q), 4, 64, generator=g).bfloat16()
    k, v = (torch.randn(sum(lens_k), 2, 64, generator=g).bfloat16() for _ in range(2))
    block = torch.rand(len(lens_q), 4, nq, nk, generator=g) < 0.5
    mask = torch.rand(len(lens_q), 4, mq, mk, generator=g) < 0.7
    bias = torch.randn(1, 4, mq, mk, generator=g)
    lists = flashattn.block_mask_from_dense(block, bs, attn_mask=mask)
    dout = torch.randn(sum(lens_q), 4, 64, generator=g).bfloat16()
    results = []
    for dev in ("cpu", "cuda"):
        to = lambda t: None if t is None else t.to(dev)  # noqa: E731
        bm = flashattn.BlockMask(*(to(t) for t in (lists.kv_num_blocks, lists.kv_indices,
                                                   lists.full_kv_num_blocks, lists.full_kv_indices)),
                                 block_size=lists.block_size, mask=to(lists.mask))
        # Leaves on each device: .to() of a tensor that requires grad would be a non-leaf.
        leaves = [t.detach().to(dev).requires_grad_() for t in (q, k, v, bias)]
        out = flashattn.flash_attn_varlen_func(*leaves[:3], to(cu_q), to(cu_k), mq, mk, block_mask=bm,
                                               attn_bias=leaves[3])
        out.backward(to(dout))
        results.append([out.detach().float().cpu()] + [t.grad.float().cpu() for t in leaves])
    # The CPU result is within float32 rounding of float64: it stands in for the reference, its
    # bf16 rounding for the naive term, and the slack covers P's rounding to bf16 before P.V
    # (a few bf16 ulps of outputs below 1).
    for name, gpu, cpu in zip(("out", "dq", "dk", "dv", "dbias"), results[1], results[0]):
        assert_fa_close(name, gpu.numpy(), cpu.numpy(), cpu.bfloat16().float().numpy(), 2e-2)


def _keep_of(block, bq, bk, sq, sk, causal):
    """The dense keep mask (b, h, sq, sk) of a dense block mask, with bottom-right causal."""
    import torch
    keep = block.repeat_interleave(bq, dim=2)[:, :, :sq].repeat_interleave(bk, dim=3)[..., :sk]
    if causal:
        i = torch.arange(sq, device=block.device)[:, None]
        j = torch.arange(sk, device=block.device)[None, :]
        keep = keep & (j <= i + sk - sq)
    return keep


def _masked_attention(q, k, v, keep):
    """softmax(q k^T / sqrt(d), masked by keep) v in q's dtype; rows with no kept key give 0."""
    import torch
    h, hk = q.shape[2], k.shape[2]
    k, v = k.repeat_interleave(h // hk, dim=2), v.repeat_interleave(h // hk, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, k) * q.shape[-1] ** -0.5
    s = s.masked_fill(~keep, float("-inf"))
    has_key = keep.any(dim=-1, keepdim=True)
    p = torch.softmax(torch.where(has_key, s, torch.zeros_like(s)), dim=-1)
    p = torch.where(has_key, p, torch.zeros_like(p))
    return torch.einsum("bhij,bjhd->bihd", p, v)


def _sm90_case(torch, shape, seed, block_size, causal):
    """The sm90-against-sm80 tests' inputs on the GPU: bf16 q, k, v, dout of shape (b, sq, sk, h,
    hk, d), a random block mask keeping 40% of the blocks with query block 0 keeping nothing, and
    the float64 reference and the naive same-precision computation of out and the gradients."""
    import torch_ref
    b, sq, sk, h, hk, d = shape
    bq, bk = block_size
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, sq, h, d, device="cuda", generator=g).bfloat16()
    k, v = (torch.randn(b, sk, hk, d, device="cuda", generator=g).bfloat16() for _ in range(2))
    dout = torch.randn(b, sq, h, d, device="cuda", generator=g).bfloat16()
    nq, nk = -(-sq // bq), -(-sk // bk)
    block = torch.rand(b, h, nq, nk, device="cuda", generator=g) < 0.4
    block[:, :, 0] = False  # query block 0 keeps nothing
    keep = _keep_of(block, bq, bk, sq, sk, causal)
    ref = torch_ref.values_and_grads(lambda q, k, v: _masked_attention(q, k, v, keep),
                                     [x.double() for x in (q, k, v)], dout)
    naive = torch_ref.values_and_grads(lambda q, k, v: _masked_attention(q, k, v, keep), [q, k, v], dout)
    return q, k, v, dout, block, ref, naive


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_size", [(128, 128), (96, 80)])
def test_cuda_sm90_block_sparse_forward_matches_sm80(block_size, causal):
    """On a Hopper GPU a forward with a block mask (and no attn_bias) runs on the sm90 kernels
    (FLASHATTN_CUDA_PATH auto or sm90; under sm80 both runs below are sm80); so does the backward
    (test_cuda_sm90_block_sparse_backward_matches_sm80 below), recomputing from that forward's
    LSE. The same call with the sm90 forward and with
    the sm80 one (the fwd_sm80 switch) in one process, each against the float64 reference: out
    and the gradients. 128 x 128 blocks give clean tiles, 96 x 80 mixed ones; GQA, ragged
    lengths, rows with no kept block."""
    torch = _torch()
    if not torch.cuda.is_available() or not flashattn.cuda_available():
        pytest.skip("no CUDA device")
    import torch_ref
    from attn_ref import assert_fa_close
    bq = block_size[0]
    # 9 query tiles x 16 planes = 144 CTAs: a full grid, so the split heuristic leaves the call
    # to the sm90 forward in the auto mode too.
    q, k, v, dout, block, ref, naive = _sm90_case(torch, (2, 1100, 1300, 8, 2, 128), 18, block_size, causal)
    for sm80 in (False, True):
        saved = flashattn._C._set_switch("fwd_sm80", sm80)
        try:
            ours = torch_ref.values_and_grads(
                lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=causal, block_mask=block,
                                                          block_size=block_size), [q, k, v], dout)
        finally:
            flashattn._C._set_switch("fwd_sm80", saved)
        for name, o, r, n in zip(("out", "dq", "dk", "dv"), ours, ref, naive):
            assert_fa_close(f"{name} (sm80 forward: {sm80})", o, r, n, 1e-2)
        assert not ours[0][:, :bq].any(), "rows of a query block with no kept block are 0"


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_size", [(128, 128), (96, 80), (64, 64)])
def test_cuda_sm90_block_sparse_backward_matches_sm80(block_size, causal, deterministic, head_dim):
    """On a Hopper GPU the backward of a block-mask call (no attn_bias, softcap, ALiBi or
    dropout; head dims 64 and 128) runs on the sm90 kernels (FLASHATTN_CUDA_PATH auto or sm90;
    under sm80 both runs below are sm80). The same call with the sm90 backward and with the sm80
    one (the bwd_sm80 switch) in one process, each against the float64 reference, in both dQ
    modes (the deterministic one twice: the same bits). 128 x 128 and 64 x 64 blocks give clean
    tiles, 96 x 80 mixed ones; GQA, ragged lengths, a query block that keeps nothing (zero dq).
    d64 and d128: their kernels step different query tiles (128 rows at d64, where 64 x 64 and
    96 x 80 blocks make mixed 128-row tiles; 64 at d128)."""
    torch = _torch()
    if not torch.cuda.is_available() or not flashattn.cuda_available():
        pytest.skip("no CUDA device")
    import torch_ref
    from attn_ref import assert_fa_close
    bq = block_size[0]
    q, k, v, dout, block, ref, naive = _sm90_case(torch, (2, 700, 900, 8, 2, head_dim), 19, block_size, causal)

    def run():
        return torch_ref.values_and_grads(
            lambda q, k, v: flashattn.flash_attn_func(q, k, v, causal=causal, deterministic=deterministic,
                                                      block_mask=block, block_size=block_size), [q, k, v], dout)

    for sm80 in (False, True):
        saved = flashattn._C._set_switch("bwd_sm80", sm80)
        try:
            ours = run()
            again = run() if deterministic else None
        finally:
            flashattn._C._set_switch("bwd_sm80", saved)
        for name, o, r, n in zip(("out", "dq", "dk", "dv"), ours, ref, naive):
            assert_fa_close(f"{name} (sm80 backward: {sm80})", o, r, n, 1e-2)
        assert not ours[1][:, :bq].any(), "dq of a query block with no kept block is 0"
        if deterministic:
            for name, x, y in zip(("dq", "dk", "dv"), ours[1:], again[1:]):
                assert np.array_equal(x, y), f"deterministic {name} differs between runs (sm80 backward: {sm80})"

