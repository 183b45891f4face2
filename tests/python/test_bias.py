"""Additive bias, boolean mask and block-sparse mask (issue 18) through the Python package:
numpy arrays (forward through flash_attn_func, backward and dbias through the low-level API)
against a float64 numpy reference, torch autograd (dq, dk, dv and the bias gradient, expanded
biases included) against float64 torch autograd, and the CUDA forward and backward (bf16, bias in
float32 and bfloat16; dq, dk, dv and dbias, deterministic mode bitwise repeatable) against
float64 torch with the naive bf16 computation as the yardstick, each broadcast pattern of dbias
at lengths of several kernel tiles; dbias with softcap (the sm80 backward) against float64; the
Hopper forward's bias kernel (head dims 64 and 128; a mask alone 256 too) against float64 and the sm80 forward in one
process, and which calls reach it; the Hopper backward's bias kernel (every dbias pattern, varlen)
against float64 and the sm80 backward (the CUDA tests skip without a GPU)."""

import os

import numpy as np
import pytest

import flashattn
from attn_ref import assert_fa_close
from score_ref import close, dense_keep, reduce_like, reference, torch_reference

RNG = np.random.default_rng(18)


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


SHAPE = dict(b=2, sq=37, sk=53, h=4, hk=2, d=16, dv=16)
CASES = [
    dict(bias=(2, 4, 37, 53)),
    dict(bias=(1, 4, 37, 53), causal=True),                # T5-style: shared by the batch
    dict(bias=(2, 1, 1, 53), mask=(2, 1, 37, 53)),         # key padding bias + element mask
    dict(bias=(1, 1, 37, 53), block=(1, 4), bs=(8, 16), density=0.4),
    dict(block=(2, 1), bs=(16, 8), density=0.0),           # nothing kept: fully masked rows
    dict(block=(1, 4), bs=(5, 7), density=1.0),
    dict(mask=(1, 1, 37, 53), density=0.03),               # many rows keep nothing
    dict(bias=(2, 4, 1, 53), causal=True),                 # per (b, h) over the keys only
    dict(bias=(1, 1, 1, 53), block=(2, 4), bs=(8, 8), density=0.5),
]


def make_case(c):
    b, sq, sk, h = SHAPE["b"], SHAPE["sq"], SHAPE["sk"], SHAPE["h"]
    q = randn(b, sq, h, SHAPE["d"])
    k = randn(b, sk, SHAPE["hk"], SHAPE["d"])
    v = randn(b, sk, SHAPE["hk"], SHAPE["dv"])
    dout = randn(b, sq, h, SHAPE["dv"])
    bias = 2 * randn(*c["bias"]) if "bias" in c else None
    mask = None
    if "mask" in c:
        mask = RNG.random(c["mask"]) < c.get("density", 0.7)
    block, bs = None, None
    if "block" in c:
        bs = c["bs"]
        nb = (-(-sq // bs[0]), -(-sk // bs[1]))
        block = RNG.random((*c["block"], *nb)) < c["density"]
        if 0 < c["density"] < 1:
            block[:, :, 0] = False  # a block row with no kept block
    keep = dense_keep(b, h, sq, sk, c.get("causal", False), mask, block, bs)
    return q, k, v, dout, bias, mask, block, bs, keep


@pytest.mark.parametrize("case", range(len(CASES)))
def test_numpy_forward_and_backward(case):
    c = CASES[case]
    q, k, v, dout, bias, mask, block, bs, keep = make_case(c)
    scale = 1 / np.sqrt(SHAPE["d"])
    ref = reference(q, k, v, dout, bias, keep, scale)
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=c.get("causal", False),
                                            return_attn_probs=True, attn_bias=bias,
                                            attn_mask=mask, block_mask=block, block_size=bs)
    close(out, ref[0], "out")
    close(lse, ref[1], "lse")
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    dbias = np.empty(bias.shape, np.float32) if bias is not None else None
    flashattn.backward(dout, q, k, v, out, lse, dq, dk, dv, causal=c.get("causal", False),
                       attn_bias=bias, attn_mask=mask, block_mask=block, block_size=bs,
                       dbias=dbias)
    close(dq, ref[2], "dq")
    close(dk, ref[3], "dk")
    close(dv, ref[4], "dv")
    if bias is not None:
        close(dbias, reduce_like(ref[5], bias.shape), "dbias")


def test_block_size_is_checked():
    q, k, v, *_ = make_case(CASES[0])
    block = np.ones((1, 1, 5, 4), dtype=bool)
    with pytest.raises(ValueError, match="block_size"):
        flashattn.flash_attn_func(q, k, v, block_mask=block)
    with pytest.raises(ValueError, match="block_size was given without block_mask"):
        flashattn.flash_attn_func(q, k, v, block_size=(8, 8))
    with pytest.raises(ValueError, match="block_mask must be broadcastable"):
        flashattn.flash_attn_func(q, k, v, block_mask=block, block_size=(4, 4))
    with pytest.raises(ValueError, match="attn_bias must be broadcastable"):
        flashattn.flash_attn_func(q, k, v, attn_bias=randn(2, 4, 3, 53))


# ---- torch -----------------------------------------------------------------------------------

def _torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("expanded", [False, True])
def test_torch_autograd(case, expanded):
    torch = _torch()
    c = CASES[case]
    q, k, v, dout, bias, mask, block, bs, keep = make_case(c)
    t = {n: torch.from_numpy(x) for n, x in dict(q=q, k=k, v=v, dout=dout).items()}
    leaf = {n: t[n].clone().requires_grad_() for n in ("q", "k", "v")}
    bias_leaf = torch.from_numpy(bias).requires_grad_() if bias is not None else None
    # An expand()ed bias (stride 0 in its broadcast dimensions) goes in as it is.
    full = (SHAPE["b"], SHAPE["h"], SHAPE["sq"], SHAPE["sk"])
    bias_in = bias_leaf.expand(full) if expanded and bias_leaf is not None else bias_leaf
    out = flashattn.flash_attn_func(
        leaf["q"], leaf["k"], leaf["v"], causal=c.get("causal", False), attn_bias=bias_in,
        attn_mask=torch.from_numpy(mask) if mask is not None else None,
        block_mask=torch.from_numpy(block) if block is not None else None, block_size=bs)
    out.backward(t["dout"])

    ref_leaf = {n: t[n].double().requires_grad_() for n in ("q", "k", "v")}
    ref_bias = torch.from_numpy(bias).double().requires_grad_() if bias is not None else None
    ref = torch_reference(ref_leaf["q"], ref_leaf["k"], ref_leaf["v"], ref_bias,
                          torch.from_numpy(keep), 1 / np.sqrt(SHAPE["d"]))
    ref.backward(t["dout"].double())
    close(out.detach().numpy(), ref.detach().numpy(), "out")
    for n in ("q", "k", "v"):
        close(leaf[n].grad.numpy(), ref_leaf[n].grad.numpy(), "d" + n)
    if bias is not None:
        assert bias_leaf.grad is not None and bias_leaf.grad.shape == bias_leaf.shape
        close(bias_leaf.grad.numpy(), ref_bias.grad.numpy(), "dbias")


def test_torch_bias_without_grad_and_opcheck():
    torch = _torch()
    q, k, v, dout, bias, mask, block, bs, keep = make_case(CASES[3])
    qt, kt, vt = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
    bias_t = torch.from_numpy(bias)  # no grad: the backward computes no dbias
    out = flashattn.flash_attn_func(qt, kt, vt, attn_bias=bias_t,
                                    block_mask=torch.from_numpy(block), block_size=bs)
    out.backward(torch.from_numpy(dout))
    assert bias_t.grad is None and qt.grad is not None
    ops = torch.ops.flashattn
    args = (qt, kt, vt, None, None, 0, 0, None, 0.0, False, -1, -1, 0.0, 0.0, None, False, None,
            torch.from_numpy(bias).requires_grad_(), torch.from_numpy(mask if mask is not None else keep[:, :1]),
            torch.from_numpy(block), bs[0], bs[1])
    torch.library.opcheck(ops.fwd.default, args)


def _cuda_torch():
    torch = _torch()
    if not flashattn.cuda_built() or not flashattn.cuda_available() or not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch


def cuda_case(torch, c, dtype, bias_dtype):
    """The case on the GPU: q, k, v, dout in dtype, the bias in bias_dtype, masks as bool."""
    q, k, v, dout, bias, mask, block, bs, keep = make_case(c)
    dev = torch.device("cuda")
    t = [torch.from_numpy(x).to(dev, dtype) for x in (q, k, v, dout)]
    bias_t = torch.from_numpy(bias).to(dev, bias_dtype) if bias is not None else None
    mask_t = torch.from_numpy(mask).to(dev) if mask is not None else None
    block_t = torch.from_numpy(block).to(dev) if block is not None else None
    return t, bias_t, mask_t, block_t, bs, torch.from_numpy(keep).to(dev)


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("bias_dtype", ["float32", "bfloat16"])
def test_cuda_forward_matches_float64(case, bias_dtype):
    torch = _cuda_torch()
    c = CASES[case]
    (q, k, v, _), bias, mask, block, bs, keep = cuda_case(torch, c, torch.bfloat16, getattr(torch, bias_dtype))
    out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=c.get("causal", False), return_attn_probs=True,
                                            attn_bias=bias, attn_mask=mask, block_mask=block, block_size=bs)
    scale = 1 / np.sqrt(SHAPE["d"])
    ref = torch_reference(q.double(), k.double(), v.double(), bias.double() if bias is not None else None,
                          keep, scale)
    naive = torch_reference(q, k, v, bias, keep, scale)
    assert_fa_close("out", out.float().cpu().numpy(), ref.cpu().numpy(), naive.float().cpu().numpy(), 1e-3)
    # Rows with no visible key: LSE -inf exactly where the keep mask has nothing.
    empty = ~keep.any(dim=-1)
    assert torch.equal(torch.isinf(lse), empty)


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("bias_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_cuda_backward_matches_float64(case, bias_dtype, deterministic):
    """dq, dk, dv and dbias (the bias requires grad) through autograd on the GPU against float64
    torch autograd, with the naive bf16 autograd as the yardstick; deterministic runs give the
    same bits twice. dbias takes dbias_atol, as in test_cuda_dbias_broadcast_patterns: with a
    float32 bias the naive yardstick's softmax and its D = sum P dP run in float32 from its own
    dP, so its dbias lacks the kernel's main error, D = rowsum(dO * out) from the bf16 out, which
    a bias broadcast over the query rows sums over them (case 7 measured 0.0547 against
    2 x naive 0.0111 + 0.01 on the H200, 2026-12-01; dev/NOTES.md, branch sparse-bwd)."""
    torch = _cuda_torch()
    import torch_ref
    c = CASES[case]
    (q, k, v, dout), bias, mask, block, bs, keep = cuda_case(torch, c, torch.bfloat16, getattr(torch, bias_dtype))
    scale = 1 / np.sqrt(SHAPE["d"])

    def fa(q, k, v, *b):
        return flashattn.flash_attn_func(q, k, v, causal=c.get("causal", False), deterministic=deterministic,
                                         attn_bias=b[0] if b else None, attn_mask=mask, block_mask=block,
                                         block_size=bs)

    def ref(q, k, v, *b):
        return torch_reference(q, k, v, b[0] if b else None, keep, scale)

    inputs = [q, k, v] + ([bias] if bias is not None else [])
    ours = torch_ref.values_and_grads(fa, inputs, dout)
    ref64 = torch_ref.values_and_grads(ref, [x.double() for x in inputs], dout)
    naive = torch_ref.values_and_grads(ref, inputs, dout)
    for name, o, r, n in zip(("out", "dq", "dk", "dv", "dbias"), ours, ref64, naive):
        assert_fa_close(name, o, r, n, {"out": 1e-3, "dbias": dbias_atol(r)}.get(name, 1e-2))
    if deterministic:
        again = torch_ref.values_and_grads(fa, inputs, dout)
        for name, a, b in zip(("out", "dq", "dk", "dv", "dbias"), ours, again):
            assert np.array_equal(a, b), f"{name} differs between deterministic runs"


# dbias on the GPU for each broadcast pattern of the bias at lengths of several kernel tiles
# (the CUDA backward sums a bias broadcast over the query rows across query blocks inside a CTA,
# and one broadcast over the batch or heads through partials; cuda/bwd_dbias.h).
LONG = dict(b=2, sq=300, sk=520, h=4, hk=2, d=64)
LONG_BIASES = [(2, 4, 300, 520), (2, 1, 1, 520), (1, 4, 300, 520), (1, 1, 300, 520), (2, 4, 1, 520),
               (1, 1, 1, 520)]


@pytest.mark.parametrize("bias_shape", LONG_BIASES)
@pytest.mark.parametrize("masked", [False, True])
def test_cuda_dbias_broadcast_patterns(bias_shape, masked):
    """dq, dk, dv and dbias against float64 with the naive bf16 computation as the yardstick;
    masked: an element mask that leaves some rows no key, and causal."""
    torch = _cuda_torch()
    import torch_ref
    b, sq, sk, h, hk, d = (LONG[x] for x in ("b", "sq", "sk", "h", "hk", "d"))
    dev = torch.device("cuda")
    q, dout = (torch.from_numpy(randn(b, sq, h, d)).to(dev, torch.bfloat16) for _ in range(2))
    k, v = (torch.from_numpy(randn(b, sk, hk, d)).to(dev, torch.bfloat16) for _ in range(2))
    bias = torch.from_numpy(2 * randn(*bias_shape)).to(dev)
    mask = None
    if masked:
        m = RNG.random((b, 1, sq, sk)) < 0.5
        m[:, :, 5:9] = False  # rows with no kept key
        mask = torch.from_numpy(m).to(dev)
    keep = torch.from_numpy(dense_keep(b, h, sq, sk, masked, m if masked else None, None, None)).to(dev)
    scale = 1 / np.sqrt(d)

    def fa(q, k, v, bias):
        return flashattn.flash_attn_func(q, k, v, causal=masked, attn_bias=bias, attn_mask=mask)

    def ref(q, k, v, bias):
        return torch_reference(q, k, v, bias, keep, scale)

    inputs = [q, k, v, bias]
    ours = torch_ref.values_and_grads(fa, inputs, dout)
    ref64 = torch_ref.values_and_grads(ref, [x.double() for x in inputs], dout)
    naive = torch_ref.values_and_grads(ref, inputs, dout)
    for name, o, r, n in zip(("out", "dq", "dk", "dv", "dbias"), ours, ref64, naive):
        assert_fa_close(name, o, r, n, {"out": 1e-3, "dbias": dbias_atol(r)}.get(name, 1e-2))


def dbias_atol(ref):
    """dbias summed over hundreds of rows reaches tens: besides the naive bf16 yardstick, the
    bound of the C++ suite (score_mods_util.h), 2 u (max|dbias| + 0.3) with u = 2^-8, as D =
    rowsum(dO * out) reads the bf16 out (a bf16 CPU run of these cases measured up to 2.5x the
    naive error on the row-summed dbias, well inside this)."""
    return max(1e-2, 2 * 2.0**-8 * (np.abs(ref).max() + 0.3))


def test_torch_bias_is_the_only_leaf():
    """Only the bias requires grad: autograd still records the op and returns dbias; the
    backward op with bias_grad=True passes opcheck (schema, fake kernel)."""
    torch = _torch()
    q, k, v, dout, bias, mask, block, bs, keep = make_case(CASES[1])
    qt, kt, vt, dt = (torch.from_numpy(x) for x in (q, k, v, dout))
    bias_t = torch.from_numpy(bias).requires_grad_()
    out = flashattn.flash_attn_func(qt, kt, vt, causal=True, attn_bias=bias_t)
    out.backward(dt)
    ref_bias = torch.from_numpy(bias).double().requires_grad_()
    ref = torch_reference(qt.double(), kt.double(), vt.double(), ref_bias, torch.from_numpy(keep),
                          1 / np.sqrt(SHAPE["d"]))
    ref.backward(dt.double())
    close(bias_t.grad.numpy(), ref_bias.grad.numpy(), "dbias")
    ops = torch.ops.flashattn
    opts = (None, None, 0, 0, None, 0.0, True, -1, -1, 0.0, 0.0, None, False, None,
            torch.from_numpy(bias), None, None, 0, 0, None, None, None, None)
    out, lse = ops.fwd(qt, kt, vt, *opts)
    bwd_args = (dt, qt, kt, vt, out, lse) + opts + (True,)
    torch.library.opcheck(ops.bwd.default, bwd_args, test_utils=("test_schema", "test_faketensor"))
    grads = ops.bwd(*bwd_args)
    assert len(grads) == 5 and grads[-1].shape == bias.shape and grads[-2].shape == (0,)


# ---- The Hopper forward with attn_bias / attn_mask (sm90/fwd_kernel.h, FwdBiasTraits) ----------
# Head dims 64 and 128 with a bias in q's dtype (the bias tile travels by the copy engine: 16-byte
# aligned base and strides) and/or attn_mask, no block mask, run their forward on the sm90 kernels
# on a Hopper GPU: under FLASHATTN_CUDA_PATH=sm90 every case below, under auto those the split
# heuristic leaves there (full grids), under sm80 none (both runs of a comparison are then sm80).
# Each case runs with the sm90 forward and with the sm80 one (the fwd_sm80 switch) in one process,
# each against float64 with the naive low-precision computation as the yardstick: out and LSE
# (-inf exactly on rows with no visible key).
SM90_SHAPE = dict(b=2, sq=300, sk=520, h=8, hk=2)
SM90_CASES = [
    dict(d=128, bias=(2, 8, 300, 520)),                                   # full bias, GQA
    dict(d=64, bias=(1, 8, 300, 520), causal=True),                       # T5-style, causal
    dict(d=128, bias=(2, 1, 300, 520), window=(100, 30)),                 # per batch entry, window
    dict(d=128, bias=(2, 1, 1, 520), mask=(2, 1, 300, 520), empty_rows=True),  # key padding + mask
    dict(d=64, mask=(1, 1, 300, 520), density=0.03),                      # mask only, many empty rows
    dict(d=128, mask=(2, 8, 300, 520), density=0.5, causal=True, empty_rows=True),
    dict(d=128, sq=113, sk=257, bias=(2, 8, 113, 257), pad=264),          # ragged, padded rows: sm90
    dict(d=64, sq=113, sk=257, bias=(2, 8, 113, 257), causal=True),       # rows of 514 bytes: sm80
    dict(d=128, bias=(1, 1, 300, 520), dtype="float16", causal=True),
    dict(d=128, bias=(1, 8, 300, 520), expand=True),                      # expanded: batch stride 0
    dict(d=64, bias=(1, 1, 1, 520), softcap=5.0),                         # all broadcast, softcap
    dict(d=128, bias=(2, 8, 300, 520), neg_inf=0.3, mask=(2, 1, 300, 520), density=0.7),
    dict(d=64, sq=1, sk=520, bias=(2, 8, 1, 520)),                        # one query row
    # attn_mask alone (16-byte aligned rows: until 2026-12-03 copied as a uint8 tile; now packed
    # into bits as every mask), then rows that are not 16-byte multiples.
    dict(d=128, sk=512, mask=(2, 8, 300, 512), density=0.5, causal=True, empty_rows=True),
    dict(d=64, mask=(1, 1, 300, 520), mask_pad=528, density=0.3, window=(100, 30)),  # padded rows
    dict(d=128, sk=512, mask=(2, 1, 1, 512), density=0.6),                # key padding: one-row box
    dict(d=128, sk=512, mask=(1, 8, 300, 512), softcap=5.0, empty_rows=True),    # softcap
    dict(d=64, sq=113, sk=257, mask=(2, 8, 113, 257), density=0.6, causal=True),  # rows of 257 bytes
    # bias + mask at d64 (bits, as every bias + mask)
    dict(d=64, sk=512, bias=(2, 8, 300, 512), mask=(2, 1, 300, 512), density=0.6, causal=True, empty_rows=True),
    dict(d=64, sk=512, bias=(2, 1, 1, 512), mask=(1, 8, 300, 512), density=0.5, window=(64, 16)),
    # bias + mask at d128: ragged keys, byte reads in the pack, a mask base 3 bytes off.
    dict(d=128, sk=512, bias=(2, 8, 300, 512), mask=(2, 1, 300, 512), density=0.6, causal=True, empty_rows=True),
    dict(d=128, sk=512, bias=(1, 8, 300, 512), mask=(2, 1, 1, 512), density=0.6, window=(100, 30)),  # key padding
    dict(d=128, sk=515, bias=(2, 8, 300, 515), pad=520, mask=(2, 1, 300, 515), density=0.6,
         empty_rows=True),                                                # ragged keys, byte reads
    dict(d=128, bias=(2, 1, 300, 520), mask=(2, 8, 300, 520), density=0.5, softcap=5.0, empty_rows=True),
    dict(d=128, bias=(2, 8, 300, 520), mask=(1, 8, 300, 520), density=0.7, causal=True),  # batch broadcast
    dict(d=128, bias=(2, 8, 300, 520), mask=(2, 1, 300, 520), density=0.6, window=(64, 16), dtype="float16"),
    dict(d=128, sq=113, sk=257, bias=(2, 8, 113, 257), pad=264, mask=(2, 8, 113, 257), mask_shift=3, density=0.6,
         causal=True),                                                    # a mask base 3 bytes off
    dict(d=64, bias=(2, 8, 300, 520), mask=(2, 1, 300, 520), density=0.6, causal=True, empty_rows=True),
    # attn_mask alone at d256: the mask kernel on 64-key blocks (skipped where d256 is not built).
    dict(d=256, mask=(2, 1, 300, 520), density=0.6, causal=True, empty_rows=True),
    dict(d=256, mask=(1, 8, 300, 520), density=0.5, window=(100, 30)),
]


def _sm90_bias_case(torch, c, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    b, h, hk = SM90_SHAPE["b"], SM90_SHAPE["h"], SM90_SHAPE["hk"]
    sq, sk, d = c.get("sq", SM90_SHAPE["sq"]), c.get("sk", SM90_SHAPE["sk"]), c["d"]
    dtype = getattr(torch, c.get("dtype", "bfloat16"))
    q = torch.randn(b, sq, h, d, device="cuda", generator=g).to(dtype)
    k, v = (torch.randn(b, sk, hk, d, device="cuda", generator=g).to(dtype) for _ in range(2))
    bias = None
    if "bias" in c:
        shape = c["bias"]
        if c.get("expand"):
            bias = (2 * torch.randn(*shape, device="cuda", generator=g)).to(dtype).expand(b, *shape[1:])
        else:
            store = 2 * torch.randn(*shape[:3], c.get("pad", shape[3]), device="cuda", generator=g)
            bias = store[..., :shape[3]].to(dtype) if "pad" not in c else store.to(dtype)[..., :shape[3]]
        if c.get("neg_inf"):
            bias = bias.masked_fill(torch.rand(bias.shape, device="cuda", generator=g) < c["neg_inf"], float("-inf"))
    mask = None
    if "mask" in c:
        shape = c["mask"]
        # mask_pad: rows of that many bytes; mask_shift: the view starts that many bytes in
        shift = c.get("mask_shift", 0)
        store = (*shape[:3], c.get("mask_pad", shape[3]) + shift)
        mask = (torch.rand(*store, device="cuda", generator=g) < c.get("density", 0.7))[..., shift:shift + shape[3]]
        if c.get("empty_rows"):
            mask[:, :, 5:9] = False
    keep = dense_keep(b, h, sq, sk, c.get("causal", False), None if mask is None else mask.cpu().numpy(), None, None,
                      c.get("window", (-1, -1)))
    return q, k, v, bias, mask, torch.from_numpy(keep).to("cuda")


def _sm90_forward_ran(torch):
    """Whether this process's forward reaches the sm90 kernels at all: a Hopper GPU, a build with
    them, and a path that lets them (a plain forward of a full grid moves the counter)."""
    if torch.cuda.get_device_capability()[0] != 9:
        return False
    q = torch.randn(2, 1024, 16, 128, device="cuda").bfloat16()
    before = flashattn._C._sm90_forward_calls()
    flashattn.flash_attn_func(q, q, q)
    return flashattn._C._sm90_forward_calls() > before


@pytest.mark.parametrize("case", range(len(SM90_CASES)))
def test_cuda_sm90_bias_forward_matches_sm80(case):
    torch = _cuda_torch()
    c = SM90_CASES[case]
    if c["d"] == 256 and not flashattn._C._cuda_head_dim_built(256):  # nothing larger to pad to
        pytest.skip("head_dim 256 not built")
    q, k, v, bias, mask, keep = _sm90_bias_case(torch, c, 9000 + case)
    scale = 1 / np.sqrt(c["d"])
    softcap = c.get("softcap", 0.0)
    ref = torch_reference(q.double(), k.double(), v.double(), bias.double() if bias is not None else None, keep,
                          scale, softcap)
    naive = torch_reference(q, k, v, bias, keep, scale, softcap)
    # float64 LSE: logsumexp over the visible scores (rows with none: -inf).
    hk = k.shape[2]
    ke = k.double().repeat_interleave(q.shape[2] // hk, dim=2)
    s = scale * torch.einsum("bihd,bjhd->bhij", q.double(), ke)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias.double()
    lse_ref = torch.logsumexp(s.masked_fill(~keep, float("-inf")), dim=-1)
    outs = []
    for sm80 in (False, True):
        saved = flashattn._C._set_switch("fwd_sm80", sm80)
        ran90, bits = flashattn._C._sm90_forward_calls(), flashattn._C._sm90_mask_bits_calls()
        mask_kernel = flashattn._C._sm90_mask_kernel_calls()
        try:
            out, lse, _ = flashattn.flash_attn_func(q, k, v, causal=c.get("causal", False),
                                                    window_size=c.get("window", (-1, -1)), softcap=softcap,
                                                    return_attn_probs=True, attn_bias=bias, attn_mask=mask)
        finally:
            flashattn._C._set_switch("fwd_sm80", saved)
        # The bits path ran exactly when the sm90 forward did with a mask (every mask is packed).
        ran90 = flashattn._C._sm90_forward_calls() - ran90
        bits = flashattn._C._sm90_mask_bits_calls() - bits
        assert bits == (ran90 if mask is not None else 0), \
            f"mask bits calls {bits}, sm90 forward calls {ran90} (sm80 forward: {sm80})"
        # attn_mask alone (no bias or softcap) runs on the mask kernel, everything else on the bias kernel.
        mask_kernel = flashattn._C._sm90_mask_kernel_calls() - mask_kernel
        alone = mask is not None and bias is None and softcap == 0
        assert mask_kernel == (ran90 if alone else 0), \
            f"mask kernel calls {mask_kernel}, sm90 forward calls {ran90} (sm80 forward: {sm80})"
        if alone and not sm80 and os.environ.get("FLASHATTN_CUDA_PATH") == "sm90" and _sm90_forward_ran(torch):
            assert mask_kernel == 1, "under FLASHATTN_CUDA_PATH=sm90 a mask alone runs on the mask kernel"
        assert_fa_close(f"out (sm80 forward: {sm80})", out.float().cpu().numpy(), ref.cpu().numpy(),
                        naive.float().cpu().numpy(), 1e-3)
        empty = ~keep.any(dim=-1)
        assert torch.equal(torch.isinf(lse), empty), f"LSE -inf rows (sm80 forward: {sm80})"
        assert not out.float()[empty.transpose(1, 2)].any(), "rows with no visible key are 0"
        fin = ~empty
        err = (lse.double() - lse_ref)[fin].abs().max().item() if fin.any() else 0.0
        assert err < 2e-2, f"LSE error {err} (sm80 forward: {sm80})"
        outs.append(out.float())
    # The two forwards agree as two low-precision computations of the same float64 values do.
    base = (naive.float() - ref.float()).abs().max().item()
    assert (outs[0] - outs[1]).abs().max().item() <= 4 * base + 2e-3


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias_mask", "mask_only"])
def test_cuda_sm90_bias_forward_varlen(with_bias):
    """Varlen with a bias over (batch, heads, max_seqlen_q, max_seqlen_k) (positions inside each
    sequence) and an element mask, or the mask alone (the sm90 mask kernel), causal, GQA: each
    sequence against the float64 reference of its own slice, on the sm90 forward and the sm80 one."""
    torch = _cuda_torch()
    g = torch.Generator(device="cuda").manual_seed(9100)
    lens_q, lens_k = [37, 1, 400, 129, 300], [53, 300, 264, 10, 520]
    h, hk, d, mq, mk = 8, 2, 128, max([37, 1, 400, 129, 300]), 520
    B = len(lens_q)
    q = torch.randn(sum(lens_q), h, d, device="cuda", generator=g).bfloat16()
    k, v = (torch.randn(sum(lens_k), hk, d, device="cuda", generator=g).bfloat16() for _ in range(2))
    bias = (2 * torch.randn(B, h, mq, mk, device="cuda", generator=g)).bfloat16()
    mask = torch.rand(B, 1, mq, mk, device="cuda", generator=g) < 0.8
    if not with_bias:
        bias = None
    cu_q = torch.tensor([0] + list(np.cumsum(lens_q)), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + list(np.cumsum(lens_k)), dtype=torch.int32, device="cuda")
    scale = 1 / np.sqrt(d)
    for sm80 in (False, True):
        saved = flashattn._C._set_switch("fwd_sm80", sm80)
        try:
            out = flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=True, attn_bias=bias,
                                                   attn_mask=mask)
        finally:
            flashattn._C._set_switch("fwd_sm80", saved)
        for bb in range(B):
            lq, lk = lens_q[bb], lens_k[bb]
            qs = q[cu_q[bb]:cu_q[bb + 1]][None]
            ks, vs = k[cu_k[bb]:cu_k[bb + 1]][None], v[cu_k[bb]:cu_k[bb + 1]][None]
            i = torch.arange(lq, device="cuda")[:, None]
            j = torch.arange(lk, device="cuda")[None, :]
            keep = (j <= i + lk - lq)[None, None] & mask[bb:bb + 1, :, :lq, :lk]
            keep = keep.expand(1, h, lq, lk)
            bs = bias[bb:bb + 1, :, :lq, :lk] if bias is not None else None
            ref = torch_reference(qs.double(), ks.double(), vs.double(), bs.double() if bs is not None else None, keep,
                                  scale)
            naive = torch_reference(qs, ks, vs, bs, keep, scale)
            assert_fa_close(f"out of sequence {bb} (sm80 forward: {sm80})",
                            out[cu_q[bb]:cu_q[bb + 1]][None].float().cpu().numpy(), ref.cpu().numpy(),
                            naive.float().cpu().numpy(), 1e-3)


def test_cuda_sm90_bias_dispatch():
    """On a Hopper GPU with the sm90 kernels (path auto or sm90) a full-grid forward with a 16-bit
    attn_bias, or with attn_mask alone, runs on the sm90 kernels; a float32 bias, a bias with rows
    that are not 16-byte aligned and a bias with a block mask stay on sm80 (attn_mask with a block
    mask runs on the sm90 block-sparse kernel)."""
    torch = _cuda_torch()
    if not _sm90_forward_ran(torch):
        pytest.skip("the forward does not reach the sm90 kernels here (not Hopper, not built, or path sm80)")
    g = torch.Generator(device="cuda").manual_seed(9200)
    b, s, h = 2, 1104, 16  # rows of 2208 bytes: 16-byte multiples

    def run(d, bias=None, mask=None, **kw):
        q = torch.randn(b, s, h, d, device="cuda", generator=g).bfloat16()
        before = flashattn._C._sm90_forward_calls()
        out = flashattn.flash_attn_func(q, q, q, attn_bias=bias, attn_mask=mask, **kw)
        assert torch.isfinite(out.float()).all()
        return flashattn._C._sm90_forward_calls() - before

    bias = torch.randn(1, h, s, s, device="cuda", generator=g)
    mask = torch.rand(b, 1, s, s, device="cuda", generator=g) < 0.9
    assert run(128, bias.bfloat16()) == 1, "bf16 bias, d128"
    assert run(64, bias.bfloat16(), causal=True) == 1, "bf16 bias, d64, causal"
    bits, mask_kernel = flashattn._C._sm90_mask_bits_calls(), flashattn._C._sm90_mask_kernel_calls()
    assert run(128, mask=mask) == 1, "attn_mask alone"
    assert flashattn._C._sm90_mask_bits_calls() == bits + 1, "an aligned mask alone: as bits too"
    assert flashattn._C._sm90_mask_kernel_calls() == mask_kernel + 1, "attn_mask alone: on the mask kernel"
    assert run(64, mask=mask, causal=True) == 1, "attn_mask alone, d64, causal"
    assert flashattn._C._sm90_mask_kernel_calls() == mask_kernel + 2, "attn_mask alone at d64: on the mask kernel"
    assert run(128, bias.bfloat16(), mask) == 1, "bias and mask"
    assert flashattn._C._sm90_mask_bits_calls() == bits + 3, "bias and mask at d128: the mask as bits"
    assert run(128, mask=mask, softcap=5.0) == 1, "attn_mask with softcap"
    assert flashattn._C._sm90_mask_kernel_calls() == mask_kernel + 2, "bias + mask, or mask + softcap: the bias kernel"
    assert run(128, bias) == 0, "a float32 bias stays on sm80"
    odd = torch.randn(1, h, s, s + 1, device="cuda", generator=g).bfloat16()[..., :s]  # rows of 2210 bytes
    assert run(128, odd) == 0, "rows not 16-byte aligned stay on sm80"
    block = torch.rand(1, 1, -(-s // 128), -(-s // 128), device="cuda", generator=g) < 0.5
    assert run(128, bias.bfloat16(), block_mask=block, block_size=(128, 128)) == 0, "a bias with a block mask: sm80"
    assert run(128, mask=mask, block_mask=block, block_size=(128, 128)) == 1, "attn_mask in a block mask: sparse sm90"


# The Hopper backward with attn_bias (sm90/bwd_kernel.h BwdBiasTraits: 16-bit bias of the call's
# dtype, no attn_mask or block mask, head dims 64 and 128, not deterministic): each dbias pattern
# (stored per element, summed over the query rows in the kernel, partials over the batch or the
# heads), causal, window, softcap and ALiBi (the bias then needs no gradient for softcap), -inf
# entries, fp16, ragged lengths, a padded row stride (without dbias: autograd's copy of a bias
# that requires grad is contiguous, its 257-key rows not 16-byte multiples, which sm80 takes).
SM90_BWD_CASES = [
    dict(d=128, bias=(2, 8, 300, 520)),                                   # dbias stored per element
    dict(d=128, bias=(1, 8, 300, 520), causal=True),                      # T5-style: partials over the batch
    dict(d=64, bias=(2, 1, 1, 520), window=(64, 16)),                     # key padding: row sums, partials
    dict(d=64, bias=(2, 8, 1, 520), causal=True),                         # row sums stored directly
    dict(d=128, bias=(1, 1, 300, 520), dtype="float16"),                  # shared by batch and heads
    dict(d=128, bias=(2, 8, 300, 520), neg_inf=0.3, causal=True),         # -inf entries (a mask as a bias)
    dict(d=64, bias=(2, 8, 300, 520), softcap=5.0, grad=False),           # softcap: no dbias
    dict(d=128, bias=(2, 1, 300, 520), alibi=True, window=(100, 30)),     # ALiBi with a window
    dict(d=128, sq=113, sk=257, bias=(2, 8, 113, 257), pad=264, causal=True, grad=False),  # ragged, padded rows
    dict(d=64, sq=113, sk=264, bias=(2, 8, 113, 264), causal=True),      # ragged queries, dbias
    dict(d=64, sq=1, sk=520, bias=(2, 8, 1, 520)),                        # one query row
    # attn_mask, packed into bits (sm90/mask_bits.h), with and without a bias
    dict(d=128, bias=(2, 8, 300, 520), mask=(2, 1, 300, 520), density=0.6, causal=True, empty_rows=True),
    dict(d=64, mask=(1, 1, 300, 520), density=0.03),                      # mask alone, many empty rows
    dict(d=128, bias=(1, 8, 300, 520), mask=(2, 1, 1, 520), density=0.7), # key padding mask, T5 bias
    dict(d=64, mask=(2, 8, 300, 520), density=0.5, softcap=5.0, window=(64, 16)),
    dict(d=128, sk=515, mask=(2, 1, 300, 515), mask_pad=520, density=0.6),  # odd key count: byte reads
    dict(d=128, mask=(2, 1, 1, 520), density=0.7, causal=True),          # key padding mask alone: one row a step
]


@pytest.mark.parametrize("case", range(len(SM90_BWD_CASES)))
def test_cuda_sm90_bias_backward_matches_float64(case):
    """dq, dk, dv and dbias through autograd on the Hopper bias backward against float64 torch
    autograd (the naive low-precision autograd as the yardstick), the call counted on the sm90
    backward, and against the sm80 backward of the same inputs (switch bwd_sm80) within the
    yardstick's error."""
    torch = _cuda_torch()
    import torch_ref
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the sm90 backward runs on Hopper only")
    c = SM90_BWD_CASES[case]
    fa, ref, inputs, dout = _bias_grad_problem(torch, c, 9300 + case)
    names = ("out", "dq", "dk", "dv", "dbias")[:len(inputs) + 1]
    results = {}
    for sm80 in (False, True):
        saved = flashattn._C._set_switch("bwd_sm80", sm80)
        try:
            before = flashattn._C._backward_calls()[0]
            results[sm80] = torch_ref.values_and_grads(fa, inputs, dout)
            ran90 = flashattn._C._backward_calls()[0] - before
        finally:
            flashattn._C._set_switch("bwd_sm80", saved)
        assert ran90 == (0 if sm80 else 1), f"sm90 backward calls {ran90} (bwd_sm80 switch: {sm80})"
    ref64 = torch_ref.values_and_grads(ref, [x.double() for x in inputs], dout)
    naive = torch_ref.values_and_grads(ref, inputs, dout)
    for name, o, o80, r, n in zip(names, results[False], results[True], ref64, naive):
        tol = {"out": 1e-3, "dbias": dbias_atol(r)}.get(name, 1e-2)
        assert np.isfinite(o).all(), f"{name}: not finite"
        assert_fa_close(name, o, r, n, tol)
        assert_fa_close(f"{name} (sm80 backward)", o80, r, n, tol)


def _bias_grad_problem(torch, c, seed):
    """The inputs of a bias case (_sm90_bias_case), dout, and the flashattn call and the float64
    reference of it (softcap, ALiBi as a float64 bias, the keep mask) as functions of (q, k, v[,
    bias]): the bias is an input when the case wants its gradient."""
    q, k, v, bias, mask, keep = _sm90_bias_case(torch, c, seed)
    b, sq, h = q.shape[0], q.shape[1], q.shape[2]
    sk, d = k.shape[1], c["d"]
    g = torch.Generator(device="cuda").manual_seed(seed + 100)
    dout = torch.randn(b, sq, h, d, device="cuda", generator=g).to(q.dtype)
    scale = 1 / np.sqrt(d)
    softcap = c.get("softcap", 0.0)
    slopes = (torch.rand(h, device="cuda", generator=g) * 0.5).float() if c.get("alibi") else None
    ref_bias = bias
    if slopes is not None:  # ALiBi as a float64 bias for the reference: -slope |i + sk - sq - j|
        i = torch.arange(sq, device="cuda")[:, None]
        j = torch.arange(sk, device="cuda")[None, :]
        alibi = -slopes.double()[None, :, None, None] * (i + sk - sq - j).abs().double()[None, None]
        ref_bias_fn = lambda bb: bb + alibi.to(bb.dtype)  # noqa: E731
    else:
        ref_bias_fn = lambda bb: bb  # noqa: E731
    grad = c.get("grad", True) and bias is not None

    def fa(q, k, v, *bb):
        return flashattn.flash_attn_func(q, k, v, causal=c.get("causal", False), window_size=c.get("window", (-1, -1)),
                                         softcap=softcap, alibi_slopes=slopes, attn_bias=bb[0] if bb else bias,
                                         attn_mask=mask)

    def ref(q, k, v, *bb):
        b = bb[0] if bb else (ref_bias.to(q.dtype) if ref_bias is not None else torch.zeros((), dtype=q.dtype,
                                                                                             device=q.device))
        return torch_reference(q, k, v, ref_bias_fn(b), keep, scale, softcap)

    return fa, ref, [q, k, v] + ([bias] if grad else []), dout


# dbias with softcap (any GPU: the sm80 backward, which applies softcap's factor to dS after dbias
# has taken P (dP - D); the Hopper bias kernel declines it): each dbias pattern, causal, window.
DBIAS_SOFTCAP_CASES = [
    dict(d=64, bias=(2, 8, 300, 520), softcap=5.0),                        # dbias per element (bf16: partials)
    dict(d=128, bias=(1, 8, 300, 520), softcap=3.0, causal=True),          # partials over the batch
    dict(d=64, bias=(2, 1, 1, 520), softcap=5.0, window=(64, 16)),         # key padding: row sums
    dict(d=128, bias=(2, 8, 300, 520), softcap=2.0, alibi=True),           # saturated tanh, ALiBi
]


@pytest.mark.parametrize("case", range(len(DBIAS_SOFTCAP_CASES)))
def test_cuda_dbias_with_softcap_matches_float64(case):
    """dq, dk, dv and dbias with softcap through autograd against float64 torch autograd (the naive
    bf16 autograd as the yardstick); never on the sm90 backward."""
    torch = _cuda_torch()
    import torch_ref
    c = DBIAS_SOFTCAP_CASES[case]
    fa, ref, inputs, dout = _bias_grad_problem(torch, c, 9700 + case)
    before = flashattn._C._backward_calls()[0]
    got = torch_ref.values_and_grads(fa, inputs, dout)
    assert flashattn._C._backward_calls()[0] == before, "dbias with softcap reached the sm90 backward"
    ref64 = torch_ref.values_and_grads(ref, [x.double() for x in inputs], dout)
    naive = torch_ref.values_and_grads(ref, inputs, dout)
    for name, o, r, n in zip(("out", "dq", "dk", "dv", "dbias"), got, ref64, naive):
        assert np.isfinite(o).all(), f"{name}: not finite"
        assert_fa_close(name, o, r, n, {"out": 1e-3, "dbias": dbias_atol(r)}.get(name, 1e-2))


def test_cuda_sm90_bias_backward_dispatch():
    """Which backward calls with attn_bias or attn_mask reach the Hopper bias kernel: a bf16 bias
    at d64 / d128 (with dbias or not), a bias with attn_mask and attn_mask alone do; a float32
    bias, deterministic mode and head dim 256 stay on sm80, and still give finite gradients."""
    torch = _cuda_torch()
    if not _sm90_forward_ran(torch):
        pytest.skip("the forward does not reach the sm90 kernels here (not Hopper, not built, or path sm80)")
    g = torch.Generator(device="cuda").manual_seed(9600)
    b, s, h = 2, 264, 4

    def run(d, bias, bias_grad=True, mask=None, **kw):
        q, k, v = (torch.randn(b, s, h, d, device="cuda", generator=g).bfloat16().requires_grad_() for _ in range(3))
        bb = bias.clone().requires_grad_(bias_grad) if bias is not None else None
        before = flashattn._C._backward_calls()[0]
        flashattn.flash_attn_func(q, k, v, attn_bias=bb, attn_mask=mask, **kw).float().square().sum().backward()
        for t in (q, k, v) + ((bb,) if bb is not None and bias_grad else ()):
            assert torch.isfinite(t.grad.float()).all()
        return flashattn._C._backward_calls()[0] - before

    bias = torch.randn(1, h, s, s, device="cuda", generator=g)
    assert run(128, bias.bfloat16()) == 1, "bf16 bias with dbias, d128"
    assert run(64, bias.bfloat16(), bias_grad=False, causal=True) == 1, "bf16 bias without dbias, d64, causal"
    assert run(128, bias) == 0, "a float32 bias stays on sm80"
    assert run(128, bias.bfloat16(), deterministic=True) == 0, "deterministic: sm80"
    mask = torch.rand(b, 1, s, s, device="cuda", generator=g) < 0.9
    assert run(128, bias.bfloat16(), mask=mask) == 1, "bias and mask: the mask as bits"
    assert run(64, None, mask=mask, causal=True) == 1, "attn_mask alone: the mask as bits"
    if flashattn._C._cuda_head_dim_built(256):
        assert run(256, bias.bfloat16()) == 0, "head dim 256: sm80"


@pytest.mark.parametrize("shape", [(2, 4, 200, 264), (1, 4, 200, 264), (2, 4, 1, 264)])
def test_cuda_dbias_in_bias_dtype_is_float32_rounded(shape):
    """A bf16 bias's gradient comes back in bf16 through autograd, and the low-level backward's
    bf16 dbias is its float32 dbias rounded to nearest, bit for bit: per element (B,H,N,N), through
    partials (1,H,N,N), summed over the rows (B,H,1,N); causal, so some elements are never
    written by a step, and on sm80 too (switch bwd_sm80)."""
    torch = _cuda_torch()
    g = torch.Generator(device="cuda").manual_seed(9700)
    b, s, h, d = 2, 200, 4, 64
    s_k = shape[3]
    q = torch.randn(b, s, h, d, device="cuda", generator=g).bfloat16()
    k, v = (torch.randn(b, s_k, h, d, device="cuda", generator=g).bfloat16() for _ in range(2))
    bias = torch.randn(*shape, device="cuda", generator=g).bfloat16()
    dout = torch.randn(b, s, h, d, device="cuda", generator=g).bfloat16()
    bb = bias.clone().requires_grad_()
    flashattn.flash_attn_func(q, k, v, attn_bias=bb, causal=True).backward(dout)
    assert bb.grad.dtype == torch.bfloat16 and bb.grad.shape == bias.shape
    out = torch.empty_like(q)
    lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
    flashattn._lowlevel.forward(q, k, v, out, lse, causal=True, attn_bias=bias)
    for sm80 in (False, True):
        saved = flashattn._C._set_switch("bwd_sm80", sm80)
        try:
            grads = {}
            for dtype in (torch.float32, torch.bfloat16):
                dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                dbias = torch.full(shape, float("nan"), device="cuda", dtype=dtype)
                flashattn._lowlevel.backward(dout, q, k, v, out, lse, dq, dk, dv, causal=True, attn_bias=bias,
                                             dbias=dbias)
                grads[dtype] = dbias
        finally:
            flashattn._C._set_switch("bwd_sm80", saved)
        want = grads[torch.float32].bfloat16()
        assert torch.isfinite(grads[torch.float32]).all() and grads[torch.float32].abs().max() > 0
        assert torch.equal(grads[torch.bfloat16].view(torch.int16), want.view(torch.int16)), \
            f"bf16 dbias is not the float32 one rounded (bwd_sm80 {sm80})"
        if not sm80:
            assert torch.equal(bb.grad.view(torch.int16), want.view(torch.int16))


def test_cuda_sm90_bias_backward_varlen():
    """Varlen with a bias over (batch, heads, max_seqlen_q, max_seqlen_k) that requires grad,
    causal, GQA, on the Hopper bias backward: gradients of the packed q, k, v and of the bias
    against float64 autograd over each sequence's own slice."""
    torch = _cuda_torch()
    import torch_ref
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the sm90 backward runs on Hopper only")
    g = torch.Generator(device="cuda").manual_seed(9500)
    lens_q, lens_k = [37, 1, 400, 129, 300], [53, 300, 264, 10, 520]
    h, hk, d, mq, mk = 8, 2, 128, max(lens_q), 520
    B = len(lens_q)
    q = torch.randn(sum(lens_q), h, d, device="cuda", generator=g).bfloat16()
    k, v = (torch.randn(sum(lens_k), hk, d, device="cuda", generator=g).bfloat16() for _ in range(2))
    dout = torch.randn(sum(lens_q), h, d, device="cuda", generator=g).bfloat16()
    bias = (2 * torch.randn(B, h, mq, mk, device="cuda", generator=g)).bfloat16()
    cu_q = torch.tensor([0] + list(np.cumsum(lens_q)), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + list(np.cumsum(lens_k)), dtype=torch.int32, device="cuda")
    scale = 1 / np.sqrt(d)

    def fa(q, k, v, bb):
        return flashattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, mq, mk, causal=True, attn_bias=bb)

    def ref(q, k, v, bb):
        outs = []
        for i in range(B):
            lq, lk = lens_q[i], lens_k[i]
            r = torch.arange(lq, device="cuda")[:, None]
            c = torch.arange(lk, device="cuda")[None, :]
            keep = (c <= r + lk - lq)[None, None].expand(1, h, lq, lk)
            outs.append(torch_reference(q[cu_q[i]:cu_q[i + 1]][None], k[cu_k[i]:cu_k[i + 1]][None],
                                        v[cu_k[i]:cu_k[i + 1]][None], bb[i:i + 1, :, :lq, :lk], keep, scale)[0])
        return torch.cat(outs)

    before = flashattn._C._backward_calls()[0]
    ours = torch_ref.values_and_grads(fa, [q, k, v, bias], dout)
    assert flashattn._C._backward_calls()[0] - before == 1, "the sm90 backward ran"
    ref64 = torch_ref.values_and_grads(ref, [x.double() for x in (q, k, v, bias)], dout)
    naive = torch_ref.values_and_grads(ref, [q, k, v, bias], dout)
    for name, o, r, n in zip(("out", "dq", "dk", "dv", "dbias"), ours, ref64, naive):
        assert_fa_close(name, o, r, n, {"out": 1e-3, "dbias": dbias_atol(r)}.get(name, 1e-2))
    # Bias positions outside every sequence's (rows, keys) get no gradient.
    db = torch.from_numpy(ours[4])
    for i in range(B):
        assert not db[i, :, lens_q[i]:, :].any() and not db[i, :, :, lens_k[i]:].any(), f"dbias outside sequence {i}"


def _replays_match_eager(torch, graph, static, inputs, call, same):
    """Twice: fresh inputs() copied into the captured graph's static inputs, a replay, and
    same(call on the fresh inputs, run eagerly) must hold against the graph's outputs."""
    for i in range(2):
        new = inputs()
        for dst, src in zip(static, new):
            dst.copy_(src)
        graph.replay()
        torch.cuda.synchronize()
        assert same(call(*new)), f"replay {i} differs from the eager call"


def test_cuda_sm90_bias_mask_bits_graph_replay():
    """bias + mask at d128 (the mask packed into bits before the launch, in the launch's
    workspace) captured in a CUDA graph: replays with new q, k, v, bias and mask values give the
    eager call's bits, and the capture packed the mask (when the call reaches the sm90 kernels)."""
    torch = _cuda_torch()
    g = torch.Generator(device="cuda").manual_seed(9300)
    b, s, h, d = 2, 1024, 16, 128

    def inputs():
        q, k, v = (torch.randn(b, s, h, d, device="cuda", generator=g).bfloat16() for _ in range(3))
        bias = torch.randn(b, h, s, s, device="cuda", generator=g).bfloat16()
        mask = torch.rand(b, 1, s, s, device="cuda", generator=g) < 0.7
        mask[:, :, 3:5] = False
        return q, k, v, bias, mask

    static = list(inputs())
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture
        flashattn.flash_attn_func(*static[:3], causal=True, attn_bias=static[3], attn_mask=static[4])
    torch.cuda.current_stream().wait_stream(side)
    ran90, bits = flashattn._C._sm90_forward_calls(), flashattn._C._sm90_mask_bits_calls()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = flashattn.flash_attn_func(*static[:3], causal=True, attn_bias=static[3], attn_mask=static[4])
    assert flashattn._C._sm90_mask_bits_calls() - bits == flashattn._C._sm90_forward_calls() - ran90
    _replays_match_eager(torch, graph, static, inputs,
                         lambda q, k, v, bias, mask: flashattn.flash_attn_func(q, k, v, causal=True, attn_bias=bias,
                                                                               attn_mask=mask),
                         lambda eager: torch.equal(static_out, eager))


def test_cuda_large_workspace_comes_from_torch():
    """Workspaces of _torch_ops.WORKSPACE_MIN_BYTES and more come from torch's caching allocator
    (the float32 dbias partials of a bias shared over a batch of 8: 8 x 8 x 1280 x 1280 x 4 bytes,
    420 MB): torch's peak allocation covers them, and dk, dv and dbias are bit for bit those of the
    library's own pool (the allocator switched off); dq, summed with atomics, to rounding."""
    torch = _cuda_torch()
    from flashattn import _torch_ops
    if not _torch_ops.TORCH_WORKSPACE:
        pytest.skip("FLASHATTN_TORCH_WORKSPACE=0: the library's pool serves every workspace")
    g = torch.Generator(device="cuda").manual_seed(9800)
    b, s, h, d = 8, 1280, 8, 64
    q, k, v, dout = (torch.randn(b, s, h, d, device="cuda", generator=g).bfloat16() for _ in range(4))
    bias = torch.randn(1, h, s, s, device="cuda", generator=g).bfloat16()
    partials = b * h * s * s * 4
    assert partials >= _torch_ops.WORKSPACE_MIN_BYTES

    def grads():
        qq, kk, vv, bb = (x.clone().requires_grad_() for x in (q, k, v, bias))
        out = flashattn.flash_attn_func(qq, kk, vv, attn_bias=bb, causal=True)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out.backward(dout)
        torch.cuda.synchronize()
        return [x.grad for x in (qq, kk, vv, bb)], torch.cuda.max_memory_allocated() - base

    hooked, peak = grads()
    assert peak >= partials, (peak, partials)
    flashattn._C.torch_workspace_allocator(None, None, 0)
    try:
        pooled, peak_pool = grads()
    finally:
        flashattn._C.torch_workspace_allocator(_torch_ops._raw_alloc, _torch_ops._raw_delete,
                                               _torch_ops.WORKSPACE_MIN_BYTES)
    assert peak_pool < partials, (peak_pool, partials)  # the pool's memory is not torch's
    torch.testing.assert_close(hooked[0], pooled[0], rtol=1e-2, atol=1e-2)
    for name, a, p in zip(("dk", "dv", "dbias"), hooked[1:], pooled[1:]):
        assert torch.equal(a, p), name
    assert hooked[3].abs().max().item() > 0


def test_cuda_large_workspace_in_a_cuda_graph():
    """A backward whose workspace eagerly comes from torch's caching allocator (dbias partials over
    a batch of 8, 420 MB) captured in a CUDA graph: under capture the library's pool serves it (a
    memory node of the graph; torch's peak stays below it), and replays with new values give the
    eager call's dk, dv and dbias bit for bit (dq to rounding)."""
    torch = _cuda_torch()
    g = torch.Generator(device="cuda").manual_seed(9900)
    b, s, h, d = 8, 1280, 8, 64

    def inputs():
        q, k, v, dout = (torch.randn(b, s, h, d, device="cuda", generator=g).bfloat16() for _ in range(4))
        return q, k, v, dout, torch.randn(1, h, s, s, device="cuda", generator=g).bfloat16()

    def backward(q, k, v, dout, bias):
        out = torch.empty_like(q)
        lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
        flashattn._lowlevel.forward(q, k, v, out, lse, causal=True, attn_bias=bias)
        grads = (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), torch.empty_like(bias))
        flashattn._lowlevel.backward(dout, q, k, v, out, lse, *grads[:3], causal=True, attn_bias=bias,
                                     dbias=grads[3])
        return grads

    static = list(inputs())
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture
        backward(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.cuda.graph(graph):
        static_grads = backward(*static)
    assert torch.cuda.max_memory_allocated() - base < b * h * s * s * 4, "torch's allocator served the capture"

    def same(eager):
        torch.testing.assert_close(static_grads[0], eager[0], rtol=1e-2, atol=1e-2)
        assert eager[3].abs().max().item() > 0
        return all(torch.equal(a, e) for a, e in zip(static_grads[1:], eager[1:]))  # dk, dv, dbias

    _replays_match_eager(torch, graph, static, inputs, backward, same)
