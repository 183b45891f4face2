"""flash_attn_with_kvcache: numpy on the CPU backend, torch CPU tensors when torch is importable,
CUDA tensors when a GPU is present (skipped, visibly, otherwise). Every result is held to the
float64 reference of attn_ref (the cache gathered to dense here, rotary written again here),
learnable sinks included."""

import os
import re

import numpy as np
import pytest

import attn_ref
from cuda_ready import cuda_torch
import flashattn

RNG = np.random.default_rng(20261201)


def sink_logits(h):
    """(h,) float32 sink logits, by head % 4: beside the scores, -inf (no sink for that head),
    above every score (the sink sets the row maximum), beside again."""
    x = RNG.normal(0.5, 1.5, h).astype(np.float32)
    x[1::4] = -np.inf
    x[2::4] = RNG.uniform(4.0, 8.0, len(x[2::4]))
    return x


def rotate(x, cos, sin, pos, interleaved):
    """x (..., d) rotated at positions pos (broadcast against x[..., 0]); float64."""
    half = cos.shape[1]
    x = x.astype(np.float64).copy()
    c = cos.astype(np.float64)[pos]
    s = sin.astype(np.float64)[pos]
    if interleaved:
        a, b = x[..., 0:2 * half:2].copy(), x[..., 1:2 * half:2].copy()
        x[..., 0:2 * half:2] = a * c - b * s
        x[..., 1:2 * half:2] = a * s + b * c
    else:
        a, b = x[..., :half].copy(), x[..., half:2 * half].copy()
        x[..., :half] = a * c - b * s
        x[..., half:2 * half] = a * s + b * c
    return x


class Case:
    """Random inputs of one call, with the logical cache (batch, capacity, heads_k, d) and its
    physical form: dense (optionally through cache_batch_idx) or shuffled pages."""

    def __init__(self, *, b=3, sq=1, snew=0, h=4, hk=2, d=32, capacity=64, seqlens=None,
                 leftpad=None, page_size=0, batch_idx=False, rotary_dim=0, interleaved=True,
                 causal=False, window=(-1, -1), softcap=0.0, alibi=False, sink=False,
                 nan_outside=False, dtype=np.float32):
        self.__dict__.update(locals())
        del self.__dict__["self"]
        self.seqlens = np.asarray(seqlens if seqlens is not None else RNG.integers(0, capacity - snew + 1, b), np.int32)
        self.leftpad_arr = None if leftpad is None else np.asarray(leftpad, np.int32)
        rnd = lambda *s: RNG.standard_normal(s).astype(dtype)  # noqa: E731
        self.q = rnd(b, sq, h, d)
        self.k_log = rnd(b, capacity, hk, d)
        self.v_log = rnd(b, capacity, hk, d)
        if nan_outside:  # rows the call must not read hold NaN (otherwise random values)
            lp = self.leftpad_arr if self.leftpad_arr is not None else np.zeros(b, np.int32)
            for i in range(b):
                for x in (self.k_log, self.v_log):
                    x[i, :lp[i]] = np.nan
                    x[i, self.seqlens[i] + snew:] = np.nan
        self.k_new = rnd(b, snew, hk, d) if snew else None
        self.v_new = rnd(b, snew, hk, d) if snew else None
        if rotary_dim:
            inv = 10000.0 ** (-np.arange(rotary_dim // 2) * 2.0 / rotary_dim)
            ang = np.arange(capacity)[:, None] * inv[None, :]
            self.cos, self.sin = np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)
        else:
            self.cos = self.sin = None
        self.alibi = (RNG.uniform(0.05, 0.5, h).astype(np.float32)) if alibi else None
        self.sink = sink_logits(h) if sink else None
        if page_size:
            mb = capacity // page_size
            pages = RNG.permutation(b * mb + 2)
            self.block_table = pages[: b * mb].reshape(b, mb).astype(np.int32)
            self.k_cache = np.full((b * mb + 2, page_size, hk, d), np.nan, dtype)
            self.v_cache = self.k_cache.copy()
            for i in range(b):
                for blk in range(mb):
                    rows = slice(blk * page_size, (blk + 1) * page_size)
                    self.k_cache[self.block_table[i, blk]] = self.k_log[i, rows]
                    self.v_cache[self.block_table[i, blk]] = self.v_log[i, rows]
            self.batch_idx_arr = None
        else:
            self.block_table = None
            rows = RNG.permutation(b + 1)[:b] if batch_idx else np.arange(b)
            self.batch_idx_arr = rows.astype(np.int32) if batch_idx else None
            self.k_cache = np.full((b + 1, capacity, hk, d), np.nan, dtype)
            self.v_cache = self.k_cache.copy()
            self.k_cache[rows] = self.k_log
            self.v_cache[rows] = self.v_log

    def kwargs(self):
        return dict(k=self.k_new, v=self.v_new, rotary_cos=self.cos, rotary_sin=self.sin,
                    cache_seqlens=self.seqlens, cache_batch_idx=self.batch_idx_arr,
                    cache_leftpad=self.leftpad_arr, block_table=self.block_table,
                    causal=self.causal, window_size=self.window, softcap=self.softcap,
                    rotary_interleaved=self.interleaved, alibi_slopes=self.alibi,
                    learnable_sink=self.sink)

    def logical(self, cache):
        """The logical (batch, capacity, hk, d) view of a physical cache."""
        if self.block_table is not None:
            return np.stack([np.concatenate([cache[p] for p in self.block_table[i]]) for i in range(self.b)])
        rows = self.batch_idx_arr if self.batch_idx_arr is not None else np.arange(self.b)
        return cache[rows]

    def expected(self):
        """(out, lse, k_log_after, v_log_after) in float64 (caches in the storage dtype)."""
        k_after, v_after = self.k_log.copy(), self.v_log.copy()
        per_token = self.causal or self.window != (-1, -1)
        outs, lses = [], []
        for i in range(self.b):
            s0 = int(self.seqlens[i])
            if self.snew:
                kn = self.k_new[i]
                if self.rotary_dim:
                    pos = np.arange(s0, s0 + self.snew)[:, None]
                    kn = rotate(kn, self.cos, self.sin, pos, self.interleaved).astype(self.dtype)
                k_after[i, s0:s0 + self.snew] = kn
                v_after[i, s0:s0 + self.snew] = self.v_new[i]
            q = self.q[i]
            if self.rotary_dim:
                pos = (s0 + np.arange(self.sq) if per_token else np.full(self.sq, s0))[:, None]
                q = rotate(q, self.cos, self.sin, pos, self.interleaved).astype(self.dtype)
            lp = 0 if self.leftpad_arr is None else int(self.leftpad_arr[i])
            end = s0 + self.snew
            kk = k_after[i:i + 1, lp:end].astype(np.float64)
            vv = v_after[i:i + 1, lp:end].astype(np.float64)
            if end == lp:  # no key: out 0, lse -inf (with a sink: the sink)
                outs.append(np.zeros((self.sq, self.h, self.d)))
                no_key = np.full(self.h, -np.inf) if self.sink is None else self.sink.astype(np.float64)
                lses.append(np.repeat(no_key[:, None], self.sq, axis=1))
                continue
            o, l = attn_ref.forward(q[None].astype(np.float64), kk, vv, causal=self.causal,
                                    window=self.window, softcap=self.softcap, alibi=self.alibi,
                                    sink=self.sink)
            outs.append(o[0])
            lses.append(l[0])
        return np.stack(outs), np.stack(lses), k_after, v_after


def check(case, out, lse, k_cache, v_cache, atol=2e-5):
    out_ref, lse_ref, k_after, v_after = case.expected()
    np.testing.assert_allclose(np.asarray(out, np.float64), out_ref, atol=atol, rtol=0)
    finite = np.isfinite(lse_ref)
    assert np.array_equal(np.isfinite(lse), finite)
    np.testing.assert_allclose(np.asarray(lse, np.float64)[finite], lse_ref[finite], atol=atol, rtol=0)
    # The caches: every logical row as expected (rotated rows within float32 rounding).
    np.testing.assert_allclose(case.logical(np.asarray(k_cache)), k_after, atol=1e-6, rtol=0)
    np.testing.assert_array_equal(case.logical(np.asarray(v_cache)), v_after)


# ---- numpy (CPU backend) ------------------------------------------------------------------------

CASES = [
    dict(),
    dict(snew=1, sq=1),
    dict(snew=3, sq=3, causal=True, seqlens=[0, 1, 61]),
    dict(snew=2, sq=2, rotary_dim=32, interleaved=True, causal=True),
    dict(snew=2, sq=2, rotary_dim=16, interleaved=False),
    dict(snew=2, sq=4, rotary_dim=16, interleaved=False, window=(5, 0), seqlens=[10, 30, 58]),
    dict(snew=1, page_size=1, capacity=16, rotary_dim=8),
    dict(snew=2, sq=2, page_size=16, capacity=64, causal=True, rotary_dim=32),
    dict(snew=1, page_size=64, capacity=128),
    dict(snew=1, page_size=256, capacity=256, seqlens=[0, 255, 100]),
    dict(snew=2, sq=2, leftpad=[3, 0, 10], seqlens=[20, 5, 40], causal=True, batch_idx=True),
    dict(snew=2, sq=2, leftpad=[3, 0, 10], seqlens=[20, 5, 40], page_size=16, causal=True),
    dict(snew=5, sq=5, h=8, hk=1, softcap=10.0, alibi=True, window=(7, 0), page_size=16),
    dict(seqlens=[0, 0, 0], causal=True, sq=2),  # no keys: out 0, lse -inf
]


@pytest.mark.parametrize("spec", CASES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()) or "plain")
def test_numpy_matches_reference(spec):
    case = Case(**spec)
    out, lse = flashattn.flash_attn_with_kvcache(case.q, case.k_cache, case.v_cache,
                                                 return_softmax_lse=True, **case.kwargs())
    check(case, out, lse, case.k_cache, case.v_cache)


def test_numpy_paged_equals_dense_bitwise():
    for page in (1, 16, 64):
        dense = Case(snew=1, capacity=128, seqlens=[3, 100, 127])
        paged = Case(snew=1, capacity=128, seqlens=[3, 100, 127], page_size=page)
        for name in ("q", "k_new", "v_new"):
            setattr(paged, name, getattr(dense, name))
        paged.k_cache[paged.block_table.reshape(-1)] = dense.k_log.reshape(-1, page, 2, 32)
        paged.v_cache[paged.block_table.reshape(-1)] = dense.v_log.reshape(-1, page, 2, 32)
        a = flashattn.flash_attn_with_kvcache(dense.q, dense.k_cache, dense.v_cache, return_softmax_lse=True, **dense.kwargs())
        b = flashattn.flash_attn_with_kvcache(paged.q, paged.k_cache, paged.v_cache, return_softmax_lse=True, **paged.kwargs())
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_int_cache_seqlens_and_default_full_cache():
    case = Case(seqlens=[7, 7, 7], snew=1)
    kw = case.kwargs()
    kw["cache_seqlens"] = 7
    out, lse = flashattn.flash_attn_with_kvcache(case.q, case.k_cache, case.v_cache,
                                                 return_softmax_lse=True, **kw)
    check(case, out, lse, case.k_cache, case.v_cache)
    full = Case(seqlens=[64, 64, 64])
    out = flashattn.flash_attn_with_kvcache(full.q, full.k_cache, full.v_cache)
    np.testing.assert_allclose(out, full.expected()[0], atol=2e-5, rtol=0)


def test_float16_within_criterion():
    case = Case(snew=2, sq=2, rotary_dim=16, page_size=16, causal=True, dtype=np.float16)
    out, lse = flashattn.flash_attn_with_kvcache(case.q, case.k_cache, case.v_cache,
                                                 return_softmax_lse=True, **case.kwargs())
    out_ref, lse_ref, k_after, _ = case.expected()
    assert np.max(np.abs(out.astype(np.float64) - out_ref)) < 4e-3
    np.testing.assert_allclose(case.logical(case.k_cache).astype(np.float64), k_after, atol=4e-3, rtol=0)


BAD = [
    (dict(page_size=16), lambda c, kw: kw["block_table"].__setitem__((0, 0), 999), ValueError, "block_table[0][0] = 999"),
    (dict(snew=2, seqlens=[63, 0, 0]), None, ValueError, "too short for the append"),
    (dict(seqlens=[65, 0, 0]), None, ValueError, "beyond the cache"),
    (dict(page_size=16), lambda c, kw: setattr(c, "v_cache", c.v_cache[:, :8]), ValueError, "v_cache must match k_cache"),
    (dict(snew=1), lambda c, kw: kw.__setitem__("v", None), ValueError, "given together"),
    (dict(snew=1, rotary_dim=8), lambda c, kw: kw.__setitem__("rotary_cos", c.cos[:10]), ValueError, "rotary_sin must have shape"),
    (dict(snew=1, page_size=16), lambda c, kw: kw.__setitem__("cache_batch_idx", np.zeros(3, np.int32)), ValueError, "cannot be combined"),
    (dict(leftpad=[9, 0, 0], seqlens=[8, 1, 1]), None, ValueError, "cache_leftpad[0]"),
    (dict(), lambda c, kw: kw.__setitem__("cache_seqlens", np.zeros(3, np.int64)), TypeError, "cache_seqlens"),
]


@pytest.mark.parametrize("spec,mutate,exc,needle", BAD, ids=[b[3] for b in BAD])
def test_bad_inputs(spec, mutate, exc, needle):
    case = Case(**spec)
    kw = case.kwargs()
    if mutate is not None:
        mutate(case, kw)
    with pytest.raises(exc, match=re.escape(needle)):
        flashattn.flash_attn_with_kvcache(case.q, case.k_cache, case.v_cache, **kw)


# ---- learnable sinks (numpy, CPU backend) --------------------------------------------------------

SINK_CASES = [
    dict(h=32, hk=8, snew=1, page_size=16, capacity=128, seqlens=[0, 70, 127]),  # decode GQA
    dict(h=32, hk=8, snew=1, causal=True, capacity=64),
    dict(snew=3, sq=3, causal=True, rotary_dim=16, seqlens=[0, 1, 61]),
    dict(snew=2, sq=2, leftpad=[3, 0, 10], seqlens=[20, 5, 40], page_size=16, causal=True),
    dict(snew=5, sq=5, h=8, hk=1, softcap=10.0, alibi=True, window=(7, 0), page_size=16),
    dict(h=8, hk=2, seqlens=[0, 0, 9], sq=2, causal=True),  # no keys: out 0, lse = sink
]


@pytest.mark.parametrize("spec", SINK_CASES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_numpy_sink_matches_reference(spec):
    case = Case(sink=True, **spec)
    out, lse = flashattn.flash_attn_with_kvcache(case.q, case.k_cache, case.v_cache,
                                                 return_softmax_lse=True, **case.kwargs())
    check(case, out, lse, case.k_cache, case.v_cache)


def test_numpy_sink_neg_inf_equals_no_sink_bitwise():
    for spec in SINK_CASES[:3]:
        case = Case(**spec)
        plain = {name: np.copy(getattr(case, name)) for name in ("k_cache", "v_cache")}
        a = flashattn.flash_attn_with_kvcache(case.q, plain["k_cache"], plain["v_cache"],
                                              return_softmax_lse=True, **case.kwargs())
        kw = case.kwargs()
        kw["learnable_sink"] = np.full(case.h, -np.inf, np.float32)
        b = flashattn.flash_attn_with_kvcache(case.q, case.k_cache, case.v_cache,
                                              return_softmax_lse=True, **kw)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]), spec


def test_numpy_sink_is_checked():
    case = Case(snew=1, sink=True)  # 4 query heads
    kw = case.kwargs()
    kw["learnable_sink"] = case.sink[:3]
    with pytest.raises(ValueError, match=re.escape("learnable_sink must have shape (4)")):
        flashattn.flash_attn_with_kvcache(case.q, case.k_cache, case.v_cache, **kw)
    kw["learnable_sink"] = case.sink.astype(np.float16)
    with pytest.raises(TypeError, match="learnable_sink must have dtype float32"):
        flashattn.flash_attn_with_kvcache(case.q, case.k_cache, case.v_cache, **kw)


def test_read_only_cache_is_refused():
    case = Case(snew=1)
    case.k_cache.flags.writeable = False
    with pytest.raises(ValueError, match="k_cache is read-only"):
        flashattn.flash_attn_with_kvcache(case.q, case.k_cache, case.v_cache, **case.kwargs())


# ---- torch ------------------------------------------------------------------------------------

def _torch_call(case, device, **extra):
    import torch

    t = lambda x: None if x is None else torch.from_numpy(np.ascontiguousarray(x)).to(device)  # noqa: E731
    kw = {k: t(v) if isinstance(v, np.ndarray) else v for k, v in case.kwargs().items()}
    kw.update(extra)
    kc, vc = t(case.k_cache), t(case.v_cache)
    out, lse = flashattn.flash_attn_with_kvcache(t(case.q), kc, vc, return_softmax_lse=True, **kw)
    return out, lse, kc, vc


@pytest.mark.parametrize("spec", CASES[:12], ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()) or "plain")
def test_torch_cpu_matches_reference_and_mutates_cache(spec):
    pytest.importorskip("torch")
    case = Case(**spec)
    out, lse, kc, vc = _torch_call(case, "cpu")
    check(case, out.numpy(), lse.numpy(), kc.numpy(), vc.numpy())


def test_torch_through_the_op_and_opcheck():
    """The registered op (not the direct eager path) gives the same result; opcheck validates
    its schema, fake kernel and in-place mutation of the caches."""
    torch = pytest.importorskip("torch")
    from flashattn import _torch_ops

    case = Case(snew=2, sq=2, rotary_dim=16, page_size=16, causal=True)
    t = lambda x: None if x is None else torch.from_numpy(np.ascontiguousarray(x))  # noqa: E731
    args = (t(case.q), t(case.k_cache), t(case.v_cache), t(case.k_new), t(case.v_new), t(case.cos),
            t(case.sin), t(case.seqlens), None, None, t(case.block_table), None, 0.0, True, -1,
            -1, 0.0, True, 0)
    out, lse = torch.ops.flashattn.fwd_kvcache(*args)
    check(case, out.numpy(), lse.numpy(), args[1].numpy(), args[2].numpy())
    fresh = Case(snew=1, page_size=16)
    args = (t(fresh.q), t(fresh.k_cache), t(fresh.v_cache), t(fresh.k_new), t(fresh.v_new), None,
            None, t(fresh.seqlens), None, None, t(fresh.block_table), None, 0.0, False, -1, -1,
            0.0, True, 0)
    # The caches hold NaN in unused pages; opcheck compares them, and NaN != NaN.
    for c in (args[1], args[2]):
        c.nan_to_num_(0.0)
    torch.library.opcheck(_torch_ops.fwd_kvcache, args, test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("spec", SINK_CASES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_torch_cpu_sink_matches_reference(spec):
    pytest.importorskip("torch")
    case = Case(sink=True, **spec)
    out, lse, kc, vc = _torch_call(case, "cpu")
    check(case, out.numpy(), lse.numpy(), kc.numpy(), vc.numpy())


def test_torch_sink_dtype_cast_and_op():
    """A bfloat16 sink is cast to float32 (as for the other functions); the registered op takes
    the sink as its last input, and opcheck validates the schema and fake kernel with it."""
    torch = pytest.importorskip("torch")
    from flashattn import _torch_ops

    case = Case(h=8, hk=2, snew=1, page_size=16, sink=True)
    case.sink = torch.tensor(case.sink).to(torch.bfloat16).float().numpy()  # exact in bfloat16
    out, lse, kc, vc = _torch_call(case, "cpu", learnable_sink=torch.from_numpy(case.sink).to(torch.bfloat16))
    check(case, out.numpy(), lse.numpy(), kc.numpy(), vc.numpy())

    fresh = Case(h=8, hk=2, snew=1, page_size=16, sink=True)
    t = lambda x: None if x is None else torch.from_numpy(np.ascontiguousarray(x))  # noqa: E731
    args = (t(fresh.q), t(np.nan_to_num(fresh.k_cache)), t(np.nan_to_num(fresh.v_cache)),
            t(fresh.k_new), t(fresh.v_new), None, None, t(fresh.seqlens), None, None,
            t(fresh.block_table), None, 0.0, False, -1, -1, 0.0, True, 0, t(fresh.sink))
    torch.library.opcheck(_torch_ops.fwd_kvcache, args, test_utils=("test_schema", "test_faketensor"))
    fresh = Case(h=8, hk=2, snew=1, page_size=16, sink=True)
    args = (t(fresh.q), t(fresh.k_cache), t(fresh.v_cache), t(fresh.k_new), t(fresh.v_new), None,
            None, t(fresh.seqlens), None, None, t(fresh.block_table), None, 0.0, False, -1, -1,
            0.0, True, 0, t(fresh.sink))
    out, lse = torch.ops.flashattn.fwd_kvcache(*args)
    check(fresh, out.numpy(), lse.numpy(), args[1].numpy(), args[2].numpy())


def test_torch_compile_fullgraph():
    torch = pytest.importorskip("torch")
    case = Case(snew=1, page_size=16)
    t = lambda x: None if x is None else torch.from_numpy(np.ascontiguousarray(x))  # noqa: E731
    kc, vc = t(case.k_cache), t(case.v_cache)

    @torch.compile(fullgraph=True, backend="eager")
    def step(q, kc, vc, k, v, seqlens, table):
        return flashattn.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens,
                                                 block_table=table, return_softmax_lse=True)

    out, lse = step(t(case.q), kc, vc, t(case.k_new), t(case.v_new), t(case.seqlens), t(case.block_table))
    check(case, out.numpy(), lse.numpy(), kc.numpy(), vc.numpy())


# ---- CUDA -------------------------------------------------------------------------------------

CUDA_CASES = [
    dict(d=128, snew=1, capacity=256),
    dict(d=128, snew=3, sq=3, causal=True, capacity=256, seqlens=[0, 1, 250]),
    dict(d=128, snew=2, sq=2, rotary_dim=128, causal=True, capacity=128),
    dict(d=128, snew=2, sq=2, rotary_dim=64, interleaved=False, capacity=128),
    dict(d=128, snew=1, page_size=1, capacity=64),
    dict(d=128, snew=1, page_size=16, capacity=512, rotary_dim=128),
    dict(d=128, snew=1, page_size=64, capacity=512),
    dict(d=128, snew=1, page_size=256, capacity=1024),
    dict(d=128, snew=2, sq=2, leftpad=[3, 0, 10], seqlens=[20, 5, 40], causal=True, batch_idx=True),
    dict(d=128, h=32, hk=8, snew=1, page_size=16, capacity=4096),
    # 2-16 query tokens with GQA (folded into decode tiles: 16, 16, 12, 12, 40 and 32 rows).
    dict(d=128, h=32, hk=8, snew=4, sq=4, causal=True, page_size=16, capacity=1024, seqlens=[0, 3, 900]),
    dict(d=128, h=16, hk=2, snew=2, sq=2, causal=True, capacity=512, window=(20, 0), seqlens=[7, 300, 0]),
    dict(d=128, h=8, hk=2, snew=3, sq=3, causal=True, capacity=256, rotary_dim=64, seqlens=[2, 100, 250]),
    dict(d=64, h=32, hk=8, snew=3, sq=3, causal=True, capacity=512, seqlens=[0, 40, 509]),
    dict(d=128, h=64, hk=8, snew=4, sq=4, causal=True, page_size=16, capacity=512, seqlens=[2, 100, 507]),
    # Head dims the build did not instantiate: padded copies of q, the cache and k/v.
    dict(d=80, snew=2, sq=2, rotary_dim=40, causal=True, page_size=16, capacity=256),
    dict(d=40, snew=1, rotary_dim=40, interleaved=False, capacity=64, seqlens=[0, 7, 60]),
]


def _cuda_bf16_vs_cpu(torch, case, reference=False, **extra):
    """The case in bf16 on CUDA against the CPU backend's bf16 run of it and against its float32
    CPU run, which `reference` also holds to the float64 reference (check); the CUDA out."""
    cpu = _torch_call(case, "cpu")
    if reference:
        check(case, *(x.numpy() for x in cpu))
    # bf16 copies of every floating input; the CPU backend runs the same bf16 problem.
    conv = lambda x: None if x is None else torch.from_numpy(np.ascontiguousarray(x)).to(torch.bfloat16)  # noqa: E731
    q, kc, vc = conv(case.q), conv(case.k_cache), conv(case.v_cache)
    kw = {k: (conv(v) if isinstance(v, np.ndarray) and v.dtype == np.float32 and k != "alibi_slopes"
              else (torch.from_numpy(v) if isinstance(v, np.ndarray) else v))
          for k, v in case.kwargs().items()}
    kw.update(extra)
    ref_out, ref_lse = flashattn.flash_attn_with_kvcache(q, kc.clone(), vc.clone(), return_softmax_lse=True, **kw)
    dev = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    kc_d, vc_d = kc.cuda(), vc.cuda()
    out, lse = flashattn.flash_attn_with_kvcache(q.cuda(), kc_d, vc_d, return_softmax_lse=True, **dev)
    torch.cuda.synchronize()
    assert (out.float().cpu() - ref_out.float()).abs().max().item() < 2e-2
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), fin)
    assert (lse.cpu()[fin] - ref_lse[fin]).abs().max().item() < 2e-2 if fin.any() else True
    # The fp32 run of the same logical problem holds both to the float64 reference.
    assert (out.float().cpu() - cpu[0]).abs().max().item() < 5e-2
    return out


@pytest.mark.parametrize("spec", CUDA_CASES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_cuda_bf16_matches_cpu_and_reference(spec):
    _cuda_bf16_vs_cpu(cuda_torch(), Case(**spec))


# Prefill chunks (at least one 128-row tile of queries) for the sm90 cache kernel: paged at 16
# and 64 rows a page, dense through cache_batch_idx with left padding, an append with rotary,
# GQA, a window with softcap, sinks, a sequence without keys; every cache row outside a
# sequence's [leftpad, end) holds NaN (nan_outside).
SM90_CACHE_CASES = [
    dict(d=128, h=8, hk=2, sq=160, snew=160, causal=True, page_size=16, capacity=512, rotary_dim=64,
         seqlens=[0, 200, 351]),
    dict(d=128, h=4, hk=4, sq=128, causal=True, page_size=64, capacity=512, seqlens=[0, 129, 500]),
    dict(d=128, h=8, hk=1, sq=200, page_size=16, capacity=512, window=(100, 20), softcap=15.0, sink=True,
         seqlens=[300, 7, 511]),
    dict(d=64, h=4, hk=2, sq=130, snew=130, causal=True, capacity=512, leftpad=[7, 0, 90], batch_idx=True,
         seqlens=[140, 300, 90]),
]
SM90_CACHE_CASES = [dict(spec, nan_outside=True) for spec in SM90_CACHE_CASES]


@pytest.mark.parametrize("spec", SM90_CACHE_CASES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_cuda_sm90_cache_kernel_prefill(spec):
    """The sm90 cache kernel (switch sm90_cache; off by default until measured) against the CPU
    backend and the float64 reference, and against the sm80 cache kernels on the same call. On a
    Hopper GPU with the sm90a kernels built it must have run (the sm90 forward counter)."""
    torch = cuda_torch()
    # A head dim not built runs padded to the next built one, where the cache kernel may take it.
    run_dim = next((x for x in (32, 64, 96, 128, 192, 256) if x >= spec["d"] and flashattn._C._cuda_head_dim_built(x)),
                   0)
    hopper = (torch.cuda.get_device_capability()[0] == 9 and flashattn._C._cuda_sm90_built()
              and os.environ.get("FLASHATTN_CUDA_PATH") != "sm80" and run_dim in (64, 128, 256))
    case = Case(**spec)  # one set of inputs for both runs (a rerun of its append writes the same rows)
    outs = {}
    for on in (False, True):
        was = flashattn._C._set_switch("sm90_cache", on)
        try:
            calls = flashattn._C._sm90_forward_calls()
            outs[on] = _cuda_bf16_vs_cpu(torch, case, reference=not on, num_splits=1)
            ran = flashattn._C._sm90_forward_calls() - calls
        finally:
            flashattn._C._set_switch("sm90_cache", was)
        assert ran == (1 if on and hopper else 0), f"switch {on}: {ran} sm90 forwards"
    assert (outs[True].float() - outs[False].float()).abs().max().item() < 2e-2


def test_cuda_split_vs_unsplit_and_paged_vs_dense():
    torch = cuda_torch()
    case = Case(d=128, h=32, hk=8, snew=1, capacity=4096, seqlens=[4000, 1000, 17])
    conv = lambda x: torch.from_numpy(np.ascontiguousarray(x)).to(torch.bfloat16).cuda()  # noqa: E731
    q, kn, vn = conv(case.q), conv(case.k_new), conv(case.v_new)
    sl = torch.from_numpy(case.seqlens).cuda()
    results = {}
    for page in (0, 16):
        kl, vl = conv(case.k_log), conv(case.v_log)
        if page:
            table = torch.arange(3 * 4096 // page, dtype=torch.int32, device="cuda")
            table = table[torch.randperm(table.numel(), device="cuda")].view(3, -1).contiguous()
            kc = torch.empty(3 * 4096 // page, page, 8, 128, dtype=torch.bfloat16, device="cuda")
            vc = torch.empty_like(kc)
            kc[table.view(-1)] = kl.view(-1, page, 8, 128)
            vc[table.view(-1)] = vl.view(-1, page, 8, 128)
        else:
            table, kc, vc = None, kl, vl
        for splits in (1, 4, 0):
            out = flashattn.flash_attn_with_kvcache(q, kc.clone(), vc.clone(), kn, vn, cache_seqlens=sl,
                                                   block_table=table, num_splits=splits)
            results[(page, splits)] = out
    # The same split count adds the same terms in the same order: the same bits. The heuristic's
    # count (0) may differ between the two on a Hopper GPU (dense caches take 8 splits merged in
    # thread-block clusters where the heuristic says 9-16, paged ones keep its count:
    # sm80/fwd_launch.h), so there the results agree to rounding only.
    for splits in (1, 4):
        assert torch.equal(results[(0, splits)], results[(16, splits)]), f"paged != dense, splits {splits}"
    if torch.cuda.get_device_capability()[0] == 9:
        assert (results[(0, 0)].float() - results[(16, 0)].float()).abs().max().item() < 2e-2
    else:
        assert torch.equal(results[(0, 0)], results[(16, 0)]), "paged != dense, heuristic splits"
    assert (results[(0, 1)].float() - results[(0, 4)].float()).abs().max().item() < 2e-2


@pytest.mark.parametrize("h,hk,sq", [(32, 8, 2), (32, 8, 4), (16, 2, 2), (28, 4, 2), (64, 8, 4), (12, 4, 7),
                                     (32, 8, 16), (32, 8, 1)])
def test_cuda_gqa_tokens_fold(h, hk, sq):
    """Query tokens with GQA run on folded rows (token, query head) of one KV head's decode tiles
    where that reads the keys fewer times (ceil(tokens x group / 16) tiles < group: not at 32/8
    heads x 16 tokens; one token takes it only with a left window, else the one-token fold):
    one tile up to 16 rows, several beyond (32 at 64/8 x 4, 21 at 12/4 x 7). Against the same
    call with the fold switched off (one query head per CTA): the same bits at a fixed split
    count, under each split-KV merge (each row's arithmetic is the same); and against K/V
    repeated to one KV head per query head (never folded). Causal, a left window, softcap, splits,
    a paged cache, an e4m3 cache, a sink, q with its heads outermost (rows not evenly spaced in
    either layout), LSE. One token: the one-token fold against the token fold in its place
    (no_decode_fold), the same bits."""
    torch = cuda_torch()
    gen = torch.Generator(device="cuda").manual_seed(h * 100 + hk * 10 + sq)
    b, d, cap, page, g = 3, 128, 768, 16, h // hk
    rnd = lambda *s: torch.randn(*s, generator=gen, device="cuda").to(torch.bfloat16)  # noqa: E731
    q = rnd(b, h, sq, d).transpose(1, 2)  # (b, sq, h, d), token stride d, head stride sq * d
    kc, vc = rnd(b, cap, hk, d), rnd(b, cap, hk, d)
    descale = torch.rand(b, hk, generator=gen, device="cuda") + 0.5
    kc8, vc8 = ((x.float() / descale[:, None, :, None]).to(torch.float8_e4m3fn) for x in (kc, vc))
    seqlens = torch.tensor([sq, 300, cap - sq], dtype=torch.int32, device="cuda")
    sink = torch.randn(h, generator=gen, device="cuda")
    rep = lambda x: x.view(torch.uint8).repeat_interleave(g, dim=2).view(x.dtype)  # noqa: E731  (bytes: e4m3 too)
    nblk = cap // page
    table = torch.randperm(b * nblk, generator=gen, device="cuda").to(torch.int32).view(b, nblk)
    paged = lambda x: x.reshape(b * nblk, page, x.shape[2], d)[table.view(-1).argsort()].contiguous()  # noqa: E731
    tiles = -(-sq * g // 16)
    switches = ("no_token_fold", "no_decode_fold", "split_combine_counter", "split_combine_kernel")
    saved = {name: flashattn._C._set_switch(name, False) for name in switches}
    try:
        for causal, window, softcap in ((False, (-1, -1), 0.0), (True, (-1, -1), 0.0), (True, (37, 0), 0.0),
                                        (True, (-1, -1), 20.0)):
            folded = tiles < g and (sq > 1 or window[0] >= 0)
            for splits in (1, 3, 0):
                for cache in ("dense", "paged", "e4m3"):
                    kw = dict(cache_seqlens=seqlens, causal=causal, window_size=window, softcap=softcap,
                              num_splits=splits, return_softmax_lse=True, learnable_sink=sink)

                    def call(k, v, cache=cache, kw=kw):
                        if cache == "paged":
                            return flashattn.flash_attn_with_kvcache(q, paged(k), paged(v), block_table=table, **kw)
                        if cache == "e4m3":  # descales per (sequence, KV head): repeated with the heads
                            ds = descale if k.shape[2] == hk else descale.repeat_interleave(g, dim=1)
                            return flashattn.flash_attn_with_kvcache(q, k, v, k_descale=ds, v_descale=ds, **kw)
                        return flashattn.flash_attn_with_kvcache(q, k, v, **kw)
                    pair = (kc8, vc8) if cache == "e4m3" else (kc, vc)
                    rpair = tuple(rep(x) for x in pair)
                    for merge in ((None, "split_combine_counter", "split_combine_kernel") if splits == 3 else (None,)):
                        where = (f"causal {causal} window {window} softcap {softcap} splits {splits} {cache} "
                                 f"merge {merge}")
                        if merge:
                            flashattn._C._set_switch(merge, True)
                        try:
                            folds = flashattn._C._token_fold_calls()
                            got, got_lse = call(*pair)
                            assert flashattn._C._token_fold_calls() == folds + int(folded), "fold count: " + where
                            flashattn._C._set_switch("no_token_fold", True)
                            try:
                                plain, plain_lse = call(*pair)
                            finally:
                                flashattn._C._set_switch("no_token_fold", False)
                            assert flashattn._C._token_fold_calls() == folds + int(folded), "under the switch: " + where
                            alt = None
                            if sq == 1 and not folded:  # fold_gqa_decode's call: the token fold in its place
                                flashattn._C._set_switch("no_decode_fold", True)
                                try:
                                    alt, alt_lse = call(*pair)
                                finally:
                                    flashattn._C._set_switch("no_decode_fold", False)
                                assert flashattn._C._token_fold_calls() == folds + 1, "no_decode_fold: " + where
                            want, want_lse = call(*rpair)
                        finally:
                            if merge:
                                flashattn._C._set_switch(merge, False)
                        torch.cuda.synchronize()
                        assert torch.isfinite(got.float()).all(), where
                        diff = (got.float() - plain.float()).abs().max().item()
                        lse_diff = (got_lse - plain_lse).abs().max().item()
                        if splits:
                            assert torch.equal(got, plain) and torch.equal(got_lse, plain_lse), \
                                f"{where}: folded != unfolded (out {diff}, lse {lse_diff})"
                        else:  # the heuristic's split counts differ (heads_k CTAs per row group against heads)
                            assert diff < 1e-2 and lse_diff < 1e-3, where
                        assert (got.float() - want.float()).abs().max().item() < 1e-2, where
                        assert (got_lse - want_lse).abs().max().item() < 1e-3, where
                        if alt is not None:
                            # The same rows in the same tiles: the same bits, but for a causal call
                            # without softcap on the e4m3 cache, where the one-token fold drops the
                            # (no-op) mask and the masked e4m3 kernel has 128 keys per tile against
                            # 256 (with softcap both have 128; H200, 2026-12-05).
                            alt_diff = (got.float() - alt.float()).abs().max().item()
                            if causal and cache == "e4m3" and softcap == 0.0:
                                assert alt_diff < 1e-2 and (got_lse - alt_lse).abs().max().item() < 1e-3, where
                            else:
                                assert torch.equal(got, alt) and torch.equal(got_lse, alt_lse), \
                                    f"{where}: token fold != one-token fold (out {alt_diff})"
    finally:
        for name, was in saved.items():
            flashattn._C._set_switch(name, was)


def test_cuda_graph_capture_decode_step():
    """A decode step captured once and replayed with changed cache_seqlens (the split count is
    chosen from shapes only, so the captured launch stays valid): each replay matches eager."""
    torch = cuda_torch()
    case = Case(d=128, h=32, hk=8, snew=1, page_size=16, capacity=1024, seqlens=[100, 500, 7])
    conv = lambda x: torch.from_numpy(np.ascontiguousarray(x)).to(torch.bfloat16).cuda()  # noqa: E731
    q, kn, vn = conv(case.q), conv(case.k_new), conv(case.v_new)
    kc, vc = conv(np.nan_to_num(case.k_cache)), conv(np.nan_to_num(case.v_cache))
    sl = torch.from_numpy(case.seqlens).cuda()
    table = torch.from_numpy(case.block_table).cuda()
    step = lambda: flashattn.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=sl, block_table=table)  # noqa: E731
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for lens in ([101, 501, 8], [900, 3, 0]):
        sl.copy_(torch.tensor(lens, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        eager = step()
        assert torch.equal(out, eager)


def _bf16_exact(case, torch):
    """Rounds the case's floating inputs to bfloat16 values (kept as float32), so that its float64
    reference is the reference of the bfloat16 problem the GPU runs."""
    for name in ("q", "k_log", "v_log", "k_new", "v_new", "k_cache", "v_cache"):
        x = getattr(case, name)
        if x is not None:
            setattr(case, name, torch.from_numpy(x).to(torch.bfloat16).float().numpy())
    return case


CUDA_SINK_CASES = [
    # Decode GQA: the CUDA backend folds each group's 4 query heads into one KV head's rows.
    dict(d=128, h=32, hk=8, snew=1, page_size=16, capacity=512, seqlens=[0, 300, 510]),
    dict(d=128, h=32, hk=8, snew=1, causal=True, capacity=256, seqlens=[5, 0, 200]),
    dict(d=128, h=8, hk=2, seqlens=[0, 0, 40]),  # sequences without keys: out 0, lse = sink
    dict(d=128, snew=3, sq=3, causal=True, page_size=16, capacity=256, seqlens=[0, 1, 250]),
    # 2-16 query tokens with GQA: tokens x group rows folded into one KV head's decode tiles.
    dict(d=128, h=32, hk=8, snew=4, sq=4, causal=True, page_size=16, capacity=512, seqlens=[0, 3, 500]),
    dict(d=128, h=16, hk=2, snew=2, sq=2, causal=True, capacity=256, seqlens=[1, 0, 240], window=(9, 0)),
    dict(d=128, h=16, hk=2, snew=5, sq=5, causal=True, page_size=16, capacity=256, seqlens=[0, 9, 250]),
]


@pytest.mark.parametrize("splits", [1, 3, 0])
@pytest.mark.parametrize("spec", CUDA_SINK_CASES, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_cuda_bf16_sink_matches_reference(spec, splits):
    torch = cuda_torch()
    case = _bf16_exact(Case(sink=True, **spec), torch)
    conv = lambda x: None if x is None else torch.from_numpy(np.ascontiguousarray(x)).to(torch.bfloat16).cuda()  # noqa: E731
    ints = lambda x: None if x is None else torch.from_numpy(x).cuda()  # noqa: E731
    kc, vc = conv(case.k_cache), conv(case.v_cache)
    out, lse = flashattn.flash_attn_with_kvcache(
        conv(case.q), kc, vc, conv(case.k_new), conv(case.v_new), cache_seqlens=ints(case.seqlens),
        block_table=ints(case.block_table), causal=case.causal, num_splits=splits,
        return_softmax_lse=True, learnable_sink=torch.from_numpy(case.sink).cuda())
    torch.cuda.synchronize()
    out_ref, lse_ref, _, _ = case.expected()
    assert np.max(np.abs(out.float().cpu().numpy() - out_ref)) < 2e-2
    lse = lse.cpu().numpy()
    finite = np.isfinite(lse_ref)
    assert np.array_equal(np.isfinite(lse), finite)
    assert np.max(np.abs(lse[finite] - lse_ref[finite]), initial=0.0) < 2e-2
    # An empty sequence's rows are exactly 0.
    for i in np.flatnonzero(case.seqlens + case.snew == 0):
        assert torch.count_nonzero(out[int(i)]).item() == 0


def test_cuda_sink_neg_inf_equals_no_sink_bitwise():
    torch = cuda_torch()
    case = Case(d=128, h=32, hk=8, snew=1, page_size=16, capacity=512, seqlens=[0, 300, 510])
    conv = lambda x: None if x is None else torch.from_numpy(np.ascontiguousarray(x)).to(torch.bfloat16).cuda()  # noqa: E731
    ints = lambda x: torch.from_numpy(x).cuda()  # noqa: E731
    for splits in (1, 3):
        runs = []
        for sink in (None, torch.full((32,), -float("inf"), device="cuda")):
            runs.append(flashattn.flash_attn_with_kvcache(
                conv(case.q), conv(case.k_cache), conv(case.v_cache), conv(case.k_new),
                conv(case.v_new), cache_seqlens=ints(case.seqlens),
                block_table=ints(case.block_table), num_splits=splits, return_softmax_lse=True,
                learnable_sink=sink))
        assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1]), splits
