"""flash_attn_varlen_func with block_table (paged K/V; flash_attn 2.x semantics, the chunked
prefill of vLLM-style engines): numpy on the CPU backend, torch CPU tensors when torch is
importable (through the registered op too), CUDA tensors when a GPU is present (skipped,
visibly, otherwise). Every result is held to the float64 reference of attn_ref on the keys
gathered from the pages here; pages nobody reads hold NaN."""

import copy
import os

import numpy as np
import pytest

import attn_ref
from cuda_ready import cuda_torch
import flashattn

RNG = np.random.default_rng(20261204)


class Case:
    """Ragged sequences (seqlens_q, seqlens_k) whose keys lie on shuffled pages of page_size
    rows; with share_prefix every sequence's first page is sequence 0's (prefix caching)."""

    def __init__(self, *, seqlens_q=(3, 1, 0, 7), seqlens_k=(40, 1, 0, 70), h=4, hk=2, d=32,
                 page_size=16, share_prefix=False, causal=False, window=(-1, -1), softcap=0.0,
                 alibi=False, sink=False, dtype=np.float32):
        self.__dict__.update(locals())
        del self.__dict__["self"]
        b = len(seqlens_q)
        rnd = lambda *s: RNG.standard_normal(s).astype(dtype)  # noqa: E731
        self.cu_q = np.concatenate([[0], np.cumsum(seqlens_q)]).astype(np.int32)
        self.cu_k = np.concatenate([[0], np.cumsum(seqlens_k)]).astype(np.int32)
        self.q = rnd(int(self.cu_q[-1]), h, d)
        self.k_log = [rnd(n, hk, d) for n in seqlens_k]
        self.v_log = [rnd(n, hk, d) for n in seqlens_k]
        shares = [share_prefix and i > 0 and seqlens_k[i] >= page_size and seqlens_k[0] >= page_size
                  for i in range(b)]
        for i in range(b):
            if shares[i]:
                self.k_log[i][:page_size] = self.k_log[0][:page_size]
                self.v_log[i][:page_size] = self.v_log[0][:page_size]
        blocks = [-(-n // page_size) for n in seqlens_k]
        owned = sum(n - (1 if s else 0) for n, s in zip(blocks, shares))
        pages = RNG.permutation(owned + 3)  # 3 spare pages nobody reads
        mb = max(blocks) + 1
        self.block_table = np.full((b, mb), -1, np.int32)
        self.k_pages = np.full((owned + 3, page_size, hk, d), np.nan, dtype)
        self.v_pages = np.full_like(self.k_pages, np.nan)
        nxt = 0
        for i in range(b):
            for blk in range(blocks[i]):
                if blk == 0 and shares[i]:
                    self.block_table[i, 0] = self.block_table[0, 0]
                    continue
                page = pages[nxt]
                nxt += 1
                self.block_table[i, blk] = page
                rows = slice(blk * page_size, min((blk + 1) * page_size, seqlens_k[i]))
                n = rows.stop - rows.start
                self.k_pages[page, :n] = self.k_log[i][rows]
                self.v_pages[page, :n] = self.v_log[i][rows]
        self.alibi_slopes = (0.05 * np.arange(1, h + 1)).astype(np.float32) if alibi else None
        self.learnable_sink = None
        if sink:
            self.learnable_sink = RNG.normal(0.5, 1.5, h).astype(np.float32)
            self.learnable_sink[1::4] = -np.inf

    def kwargs(self):
        return dict(causal=self.causal, window_size=self.window, softcap=self.softcap,
                    alibi_slopes=self.alibi_slopes, learnable_sink=self.learnable_sink)

    def call(self, **extra):
        kw = self.kwargs()
        kw.update(extra)
        return flashattn.flash_attn_varlen_func(
            self.q, self.k_pages, self.v_pages, self.cu_q, self.cu_k, max(self.seqlens_q),
            max(self.seqlens_k), block_table=self.block_table, return_attn_probs=True, **kw)[:2]

    def packed(self):
        """The same problem on packed k and v (total_k, hk, d)."""
        k = np.concatenate(self.k_log) if sum(self.seqlens_k) else np.zeros((0, self.hk, self.d), self.dtype)
        v = np.concatenate(self.v_log) if sum(self.seqlens_k) else np.zeros_like(k)
        return flashattn.flash_attn_varlen_func(
            self.q, k, v, self.cu_q, self.cu_k, max(self.seqlens_q), max(self.seqlens_k),
            return_attn_probs=True, **self.kwargs())[:2]

    def expected(self):
        """out (total_q, h, d) and lse (h, total_q) in float64, sequence by sequence."""
        out = np.zeros(self.q.shape, np.float64)
        lse = np.full((self.h, self.q.shape[0]), -np.inf)
        for i, (sq, sk) in enumerate(zip(self.seqlens_q, self.seqlens_k)):
            if sq == 0:
                continue
            rows = slice(self.cu_q[i], self.cu_q[i + 1])
            if sk == 0:  # no key: out 0, LSE -inf (the sink's logit with a sink)
                if self.learnable_sink is not None:
                    lse[:, rows] = self.learnable_sink.astype(np.float64)[:, None]
                continue
            o, l = attn_ref.forward(
                self.q[rows][None].astype(np.float64), self.k_log[i][None].astype(np.float64),
                self.v_log[i][None].astype(np.float64), causal=self.causal, window=self.window,
                softcap=self.softcap, alibi=self.alibi_slopes, sink=self.learnable_sink)
            out[rows] = o[0]
            lse[:, rows] = l[0]
        return out, lse


def check(case, out, lse, atol=2e-5):
    out_ref, lse_ref = case.expected()
    out = np.asarray(out, np.float64)
    assert not np.isnan(out).any(), "a NaN: a page the call must not read was read"
    np.testing.assert_allclose(out, out_ref, atol=atol, rtol=0)
    finite = np.isfinite(lse_ref)
    assert np.array_equal(np.isfinite(lse), finite)
    np.testing.assert_allclose(np.asarray(lse, np.float64)[finite], lse_ref[finite], atol=atol, rtol=0)


CASES = [
    dict(),
    dict(causal=True),
    dict(page_size=1, seqlens_k=(5, 1, 0, 9)),
    dict(page_size=64, seqlens_q=(1, 1, 1), seqlens_k=(200, 3, 64), causal=True),
    dict(page_size=256, seqlens_q=(4, 2), seqlens_k=(300, 256), causal=True),
    dict(share_prefix=True, seqlens_q=(4, 3, 2), seqlens_k=(40, 16, 90), causal=True),
    dict(seqlens_q=(0, 2, 3, 0, 1), seqlens_k=(5, 0, 9, 0, 0)),  # queries without keys: out 0, lse -inf
    dict(window=(20, 3)),
    dict(softcap=5.0, causal=True, alibi=True),
    dict(sink=True, causal=True),
    dict(h=6, hk=1, seqlens_q=(1, 40, 1), seqlens_k=(77, 60, 1), causal=True),  # MQA, chunked prefill
]


@pytest.mark.parametrize("spec", CASES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()) or "plain")
def test_numpy_matches_reference(spec):
    case = Case(**spec)
    out, lse = case.call()
    check(case, out, lse)


def test_numpy_equals_packed_bitwise():
    """The CPU backend gathers the paged rows and runs the packed call's arithmetic."""
    for causal in (False, True):
        case = Case(seqlens_q=(3, 17, 1), seqlens_k=(45, 100, 7), causal=causal)
        a, b = case.call(), case.packed()
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_float16_within_criterion():
    case = Case(dtype=np.float16, causal=True)
    out, lse = case.call()
    check(case, out, lse, atol=4e-3)


@pytest.mark.parametrize("mutate, exc, needle", [
    (lambda c, kw: kw.update(dropout_p=0.1), NotImplementedError, "dropout_p"),
    (lambda c, kw: kw.update(attn_bias=np.zeros((1, 1, 7, 70), np.float32)), NotImplementedError, "attn_bias"),
    (lambda c, kw: c.block_table.__setitem__((0, 1), 999), ValueError, r"block_table\[0\]\[1\] = 999"),
    (lambda c, kw: setattr(c, "block_table", c.block_table[:, :2].copy()), ValueError, "sequence 0 has 40 keys"),
    (lambda c, kw: setattr(c, "block_table", c.block_table[:3].copy()), ValueError, "block_table must have batch"),
    (lambda c, kw: setattr(c, "block_table", c.block_table.astype(np.int64)), TypeError, "block_table has dtype int64"),
    (lambda c, kw: setattr(c, "block_table", c.block_table.astype(np.float32)), TypeError, "block_table must have dtype int32"),
    (lambda c, kw: setattr(c, "v_pages", c.v_pages[:, :8].copy()), ValueError, "v must match k"),
    (lambda c, kw: setattr(c, "k_pages", c.k_pages.reshape(-1, c.hk, c.d)), ValueError, "k must have 4 dimensions"),
])
def test_bad_inputs(mutate, exc, needle):
    case = Case()
    kw = {}
    mutate(case, kw)
    with pytest.raises(exc, match=needle):
        case.call(**kw)


def test_check_paged_metadata():
    """flashattn.check_paged_metadata: the forward's value checks on their own (free for host
    tables of CUDA calls)."""
    case = Case()
    flashattn.check_paged_metadata(case.block_table, case.cu_k, case.k_pages.shape[0], 16)
    bad = case.block_table.copy()
    bad[3, 2] = case.k_pages.shape[0]
    with pytest.raises(ValueError, match=r"block_table\[3\]\[2\] = "):
        flashattn.check_paged_metadata(bad, case.cu_k, case.k_pages.shape[0], 16)
    with pytest.raises(ValueError, match="sequence 0 has 40 keys"):
        flashattn.check_paged_metadata(case.block_table[:, :2].copy(), case.cu_k, case.k_pages.shape[0], 16)
    # A slice of a wider table (row stride != width), as the forward takes it.
    wide = np.full((case.block_table.shape[0], case.block_table.shape[1] + 3), -7, np.int32)
    wide[:, :case.block_table.shape[1]] = case.block_table
    view = wide[:, :case.block_table.shape[1]]
    flashattn.check_paged_metadata(view, case.cu_k, case.k_pages.shape[0], 16)
    out, lse = case.call()
    case.block_table = view
    out2, lse2 = case.call()
    assert np.array_equal(out, out2) and np.array_equal(lse, lse2)


# ---- torch on the CPU -------------------------------------------------------------------------

def _torch(case, device="cpu", dtype=None):
    import torch

    def t(x):
        if x is None:
            return None
        y = torch.from_numpy(np.ascontiguousarray(x))
        if dtype is not None and y.is_floating_point() and x is not case.alibi_slopes and x is not case.learnable_sink:
            y = y.to(dtype)
        return y.to(device)
    return t


@pytest.mark.parametrize("spec", CASES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()) or "plain")
def test_torch_cpu_matches_reference(spec):
    pytest.importorskip("torch")
    case = Case(**spec)
    t = _torch(case)
    kw = {k: t(v) if isinstance(v, np.ndarray) else v for k, v in case.kwargs().items()}
    out, lse, _ = flashattn.flash_attn_varlen_func(
        t(case.q), t(case.k_pages), t(case.v_pages), t(case.cu_q), t(case.cu_k), max(case.seqlens_q),
        max(case.seqlens_k), block_table=t(case.block_table), return_attn_probs=True, **kw)
    check(case, out.numpy(), lse.numpy())


def test_torch_cpu_fp8_pages():
    """float8_e4m3fn pages under bfloat16 q with k_descale / v_descale (an FP8 KV cache read in
    a varlen call): the reference attends to the dequantized pages."""
    torch = pytest.importorskip("torch")
    case = Case(causal=True)
    t = _torch(case, dtype=torch.bfloat16)
    kd = torch.tensor([0.5, 2.0], dtype=torch.float32).expand(4, 2)  # (batch, heads_k)
    vd = torch.tensor([1.5, 0.25], dtype=torch.float32).expand(4, 2)
    k8 = (torch.from_numpy(case.k_pages) / kd[0].view(1, 1, 2, 1)).to(torch.float8_e4m3fn)
    v8 = (torch.from_numpy(case.v_pages) / vd[0].view(1, 1, 2, 1)).to(torch.float8_e4m3fn)
    out, lse, _ = flashattn.flash_attn_varlen_func(
        t(case.q), k8, v8, t(case.cu_q), t(case.cu_k), 7, 70, causal=True, block_table=t(case.block_table),
        k_descale=kd, v_descale=vd, return_attn_probs=True)
    assert out.dtype == torch.bfloat16
    # The reference: q as the kernel saw it (bfloat16), keys and values dequantized from the pages.
    case.q = t(case.q).float().numpy()
    kq = (k8.float() * kd[0].view(1, 1, 2, 1)).numpy()
    vq = (v8.float() * vd[0].view(1, 1, 2, 1)).numpy()
    for i, n in enumerate(case.seqlens_k):
        rows = [(case.block_table[i, r // case.page_size], r % case.page_size) for r in range(n)]
        case.k_log[i] = np.stack([kq[p, r] for p, r in rows]) if n else case.k_log[i]
        case.v_log[i] = np.stack([vq[p, r] for p, r in rows]) if n else case.v_log[i]
    check(case, out.float().numpy(), lse.numpy(), atol=2e-2)


def test_torch_op_opcheck_and_no_backward():
    """The registered op gives the direct path's bits and passes opcheck (schema, fake kernel);
    a backward through it raises NotImplementedError naming block_table."""
    torch = pytest.importorskip("torch")
    from flashattn import _torch_ops

    case = Case(causal=True)
    case.k_pages = np.nan_to_num(case.k_pages)  # opcheck compares inputs, and NaN != NaN
    case.v_pages = np.nan_to_num(case.v_pages)
    t = _torch(case)
    args = (t(case.q), t(case.k_pages), t(case.v_pages), t(case.block_table), t(case.cu_q), t(case.cu_k),
            max(case.seqlens_q), max(case.seqlens_k), None, 32 ** -0.5, True, -1, -1, 0.0, 0)
    out, lse = torch.ops.flashattn.fwd_paged(*args)
    direct = flashattn.flash_attn_varlen_func(*args[:3], args[4], args[5], args[6], args[7], causal=True,
                                              block_table=args[3], return_attn_probs=True)
    assert torch.equal(out, direct[0]) and torch.equal(lse, direct[1])
    check(case, out.numpy(), lse.numpy())
    torch.library.opcheck(_torch_ops.fwd_paged, args, test_utils=("test_schema", "test_faketensor"))
    q = args[0].clone().requires_grad_(True)
    out = flashattn.flash_attn_varlen_func(q, *args[1:3], args[4], args[5], args[6], args[7], causal=True,
                                           block_table=args[3])
    with pytest.raises(NotImplementedError, match="block_table"):
        out.sum().backward()


def test_torch_compile_fullgraph():
    torch = pytest.importorskip("torch")
    case = Case(causal=True)
    t = _torch(case)
    q, kp, vp, table, cu_q, cu_k = (t(x) for x in (case.q, case.k_pages, case.v_pages, case.block_table,
                                                   case.cu_q, case.cu_k))

    def step(q, kp, vp, table, cu_q, cu_k):
        return flashattn.flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, 7, 70, causal=True, block_table=table)

    compiled = torch.compile(step, fullgraph=True, backend="eager")
    assert torch.equal(compiled(q, kp, vp, table, cu_q, cu_k), step(q, kp, vp, table, cu_q, cu_k))
    # Through AOT autograd (the fake kernel, no backward traced without grad), as an inference
    # engine compiles it.
    with torch.no_grad():
        aot = torch.compile(step, fullgraph=True, backend="aot_eager")
        assert torch.equal(aot(q, kp, vp, table, cu_q, cu_k), step(q, kp, vp, table, cu_q, cu_k))


# ---- CUDA ---------------------------------------------------------------------------------------

CUDA_CASES = [
    dict(d=128, h=8, hk=2, causal=True),
    dict(d=128, h=32, hk=8, page_size=16, seqlens_q=(1, 1, 1, 1), seqlens_k=(4000, 1000, 17, 1), causal=True),
    dict(d=128, h=8, hk=2, page_size=16, seqlens_q=(1, 300, 1), seqlens_k=(517, 800, 33), causal=True),
    dict(d=64, page_size=1, seqlens_k=(5, 1, 0, 9)),
    dict(d=128, page_size=256, seqlens_q=(4, 2), seqlens_k=(300, 256), causal=True, sink=True),
    dict(d=128, share_prefix=True, seqlens_q=(4, 3, 2), seqlens_k=(40, 16, 90), causal=True),
    dict(d=64, seqlens_q=(0, 2, 3, 0, 1), seqlens_k=(5, 0, 9, 0, 0)),
    dict(d=128, window=(20, 3), softcap=5.0, alibi=True),
    dict(d=40, causal=True),  # not instantiated: padded copies of the pages
]


def _cuda_bf16_vs_reference(torch, case):
    """The CUDA call in bfloat16 against the reference on the inputs as the kernel saw them; its
    out. Leaves case's inputs rounded."""
    t = _torch(case, "cuda", torch.bfloat16)
    kw = {k: t(v) if isinstance(v, np.ndarray) else v for k, v in case.kwargs().items()}
    out, lse, _ = flashattn.flash_attn_varlen_func(
        t(case.q), t(case.k_pages), t(case.v_pages), t(case.cu_q), t(case.cu_k), max(case.seqlens_q),
        max(case.seqlens_k), block_table=t(case.block_table), return_attn_probs=True, **kw)
    torch.cuda.synchronize()
    rounded = lambda x: torch.from_numpy(x).to(torch.bfloat16).float().numpy()  # noqa: E731
    case.q = rounded(case.q)
    case.k_log = [rounded(x) for x in case.k_log]
    case.v_log = [rounded(x) for x in case.v_log]
    check(case, out.float().cpu().numpy(), lse.cpu().numpy(), atol=2e-2)
    return out


@pytest.mark.parametrize("spec", CUDA_CASES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_cuda_bf16_matches_reference(spec):
    _cuda_bf16_vs_reference(cuda_torch(), Case(**spec))


@pytest.mark.parametrize("page_size", [16, 64])
def test_cuda_sm90_cache_kernel_mixed_batch(page_size):
    """A chunked-prefill step among decoding sequences (sequences of 0-300 query rows, 12 and 13
    at the decode launch's bound for 8 query heads over 2) under the four settings of two
    switches: sm90_cache (on a Hopper GPU the sequences of more than 12 rows, or all, run on the
    sm90 cache kernel) and decode_share (on: the sequences of at most 12 rows run in a launch of
    their own on the sm80 decode tiles, GQA folded; off, the default until it has run on a GPU:
    in the same launch as the rest). Each run meets the reference and all agree. 240 query tiles
    of 128 rows: more than the SMs, so the split heuristic leaves the one-launch call unsplit
    (split calls stay on sm80)."""
    torch = cuda_torch()
    hopper = (torch.cuda.get_device_capability()[0] == 9 and flashattn._C._cuda_sm90_built()
              and os.environ.get("FLASHATTN_CUDA_PATH") != "sm80" and flashattn._C._cuda_head_dim_built(128))
    spec = dict(d=128, h=8, hk=2, page_size=page_size, causal=True, seqlens_q=(1, 300, 12, 0, 127, 128, 13, 1, 3, 1),
                seqlens_k=(517, 400, 33, 5, 127, 300, 90, 0, 700, 17))
    case = Case(**spec)  # one set of inputs for every run (Case draws from the module's RNG)
    outs = {}
    for on in (False, True):
        for share in (True, False):
            was = flashattn._C._set_switch("sm90_cache", on)
            was_share = flashattn._C._set_switch("decode_share", share)
            try:
                calls = flashattn._C._sm90_forward_calls()
                folds = flashattn._C._token_fold_calls()
                shares = flashattn._C._decode_share_calls()
                outs[on, share] = _cuda_bf16_vs_reference(torch, copy.deepcopy(case))
                ran = flashattn._C._sm90_forward_calls() - calls
                folded = flashattn._C._token_fold_calls() - folds
                shared = flashattn._C._decode_share_calls() - shares
            finally:
                flashattn._C._set_switch("sm90_cache", was)
                flashattn._C._set_switch("decode_share", was_share)
            assert ran == (1 if on and hopper else 0), f"sm90_cache {on}, decode_share {share}: {ran} sm90 forwards"
            assert folded == int(share), f"sm90_cache {on}, decode_share {share}: {folded} token folds"
            assert shared == int(share), f"sm90_cache {on}, decode_share {share}: {shared} decode launches"
    for key, out in outs.items():
        assert (out.float() - outs[False, False].float()).abs().max().item() < 2e-2, key


def test_cuda_host_table_checked_for_free():
    """A CPU block table and cu_seqlens_k with CUDA tensors: their values are checked on the host
    (no device synchronisation), as CPU cu_seqlens are."""
    torch = cuda_torch()
    case = Case(d=128)
    t = _torch(case, "cuda", torch.bfloat16)
    table = torch.from_numpy(case.block_table.copy())
    table[3, 1] = 10_000
    with pytest.raises(ValueError, match=r"block_table\[3\]\[1\] = 10000"):
        flashattn.flash_attn_varlen_func(t(case.q), t(case.k_pages), t(case.v_pages), torch.from_numpy(case.cu_q),
                                         torch.from_numpy(case.cu_k), 7, 70, block_table=table)


@pytest.mark.parametrize("h,hk", [(4, 4), (32, 8)])
def test_cuda_equals_kvcache_bitwise(h, hk):
    """Equal query counts: the kernels of flash_attn_with_kvcache on the same pages
    (cache_seqlens = the key counts) in the same order. max_seqlen_k = the table's rows, so that
    the split heuristic sees the capacity the cache call sees: the same bits. With grouped heads
    both calls fold each group's query heads into one KV head's rows (one token: the cache call
    by the one-token fold without a mask, the varlen call by the token fold with the causal mask,
    which hides no key there; same split count and merge), the same bits too."""
    torch = cuda_torch()
    for sq in (1, 4):
        case = Case(d=128, h=h, hk=hk, page_size=16, seqlens_q=(sq,) * 3, seqlens_k=(900, 1, 200), causal=True)
        t = _torch(case, "cuda", torch.bfloat16)
        q, kp, vp, table = t(case.q), t(case.k_pages), t(case.v_pages), t(case.block_table)
        capacity = table.shape[1] * 16
        out_v, lse_v, _ = flashattn.flash_attn_varlen_func(
            q, kp, vp, t(case.cu_q), t(case.cu_k), sq, capacity, causal=True, block_table=table,
            return_attn_probs=True)
        out_c, lse_c = flashattn.flash_attn_with_kvcache(
            q.view(3, sq, h, 128), kp, vp, cache_seqlens=t(np.array(case.seqlens_k, np.int32)),
            block_table=table, causal=True, return_softmax_lse=True)
        assert torch.equal(out_v, out_c.view(3 * sq, h, 128)), f"seqlen_q {sq}"
        assert torch.equal(lse_v, lse_c.permute(1, 0, 2).reshape(h, 3 * sq)), f"seqlen_q {sq}"


@pytest.mark.parametrize("paged", [True, False])
def test_cuda_gqa_fold(paged):
    """Varlen calls with grouped KV heads and at most 16 query tokens per sequence (vLLM's decode
    and mixed decode batches) fold each group's (token, query head) pairs into one KV head's
    decode tiles: counted, against the float64 reference, and against the same call with the
    fold switched off (one query head per CTA; its split count may differ, so to rounding):
    pages (NaN in every row past a sequence) and packed K/V, empty sequences, causal, a left
    window, sinks, LSE."""
    torch = cuda_torch()
    switches = ("no_token_fold", "split_combine_counter", "split_combine_kernel")
    saved = {name: flashattn._C._set_switch(name, False) for name in switches}
    try:
        for seqlens_q, seqlens_k, window, merge in (
                ((1, 1, 1, 1), (900, 40, 7, 300), (-1, -1), None),
                ((1, 3, 0, 5), (900, 40, 7, 300), (-1, -1), None),
                ((1, 3, 0, 5), (900, 40, 7, 300), (-1, -1), "split_combine_kernel"),
                ((2, 1, 4, 1), (900, 40, 7, 300), (30, 0), "split_combine_counter"),
                ((2, 1, 4, 1), (100, 40, 7, 128), (-1, -1), None)):  # one key block: unsplit
            if merge:
                flashattn._C._set_switch(merge, True)
            # A left window without causal (attn_ref's causal ignores windows; flash_attn keeps
            # the left side): with right 0 the same mask as causal with that window.
            case = Case(d=128, h=32, hk=8, page_size=16, seqlens_q=seqlens_q, seqlens_k=seqlens_k,
                        causal=window == (-1, -1), window=window, sink=True)
            t = _torch(case, "cuda", torch.bfloat16)
            kw = {k: t(v) if isinstance(v, np.ndarray) else v for k, v in case.kwargs().items()}
            if paged:
                kv, extra = (t(case.k_pages), t(case.v_pages)), dict(block_table=t(case.block_table))
            else:
                kv, extra = (t(np.concatenate(case.k_log)), t(np.concatenate(case.v_log))), {}

            def call():
                return flashattn.flash_attn_varlen_func(
                    t(case.q), *kv, t(case.cu_q), t(case.cu_k), max(seqlens_q), max(case.seqlens_k),
                    return_attn_probs=True, **extra, **kw)[:2]
            where = f"seqlens_q {seqlens_q} seqlens_k {seqlens_k} window {window} merge {merge} paged {paged}"
            folds = flashattn._C._token_fold_calls()
            out, lse = call()
            # FLASHATTN_CUDA_PATH=sm90 gives packed K/V calls to the Hopper kernels (no fold there).
            sm80 = paged or os.environ.get("FLASHATTN_CUDA_PATH", "auto") != "sm90"
            assert flashattn._C._token_fold_calls() == folds + int(sm80), "fold count: " + where
            flashattn._C._set_switch("no_token_fold", True)
            try:
                plain, plain_lse = call()
            finally:
                flashattn._C._set_switch("no_token_fold", False)
            torch.cuda.synchronize()
            assert (out.float() - plain.float()).abs().max().item() < 1e-2, where
            fin = torch.isfinite(plain_lse)
            assert torch.equal(torch.isfinite(lse), fin), where
            assert (lse[fin] - plain_lse[fin]).abs().max().item() < 1e-3, where
            rounded = lambda x: torch.from_numpy(x).to(torch.bfloat16).float().numpy()  # noqa: E731
            case.q = rounded(case.q)
            case.k_log = [rounded(x) for x in case.k_log]
            case.v_log = [rounded(x) for x in case.v_log]
            check(case, out.float().cpu().numpy(), lse.cpu().numpy(), atol=2e-2)
            if merge:
                flashattn._C._set_switch(merge, False)
    finally:
        for name, was in saved.items():
            flashattn._C._set_switch(name, was)


def test_cuda_graph_capture_chunked_prefill():
    """A mixed decode / prefill step captured once and replayed with other key counts
    (cu_seqlens_k changed in place; max_seqlen_k fixed): each replay matches an eager call."""
    torch = cuda_torch()
    case = Case(d=128, h=8, hk=2, page_size=16, seqlens_q=(1, 30, 1), seqlens_k=(500, 300, 40), causal=True)
    t = _torch(case, "cuda", torch.bfloat16)
    q, kp, vp, table, cu_q, cu_k = (t(x) for x in (case.q, case.k_pages, case.v_pages, case.block_table,
                                                   case.cu_q, case.cu_k))

    def step():
        return flashattn.flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, 30, 512, causal=True, block_table=table)

    step()  # warm-up outside the capture (workspace pools, first-call setup)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for lens in ((500, 300, 40), (100, 31, 1), (496, 30, 17)):  # at most the keys written
        cu_k.copy_(torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, step()), f"lengths {lens}"
